import a_module_that_does_not_exist  # noqa: F401  (the import error the preflight must name)


def hook(args, sample):
    return 0.0

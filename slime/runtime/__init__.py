"""The CPU runtime of slime-rl's processes (ground layer: the engine, the trainer and the fleet use it).

* `cores`: a node's cores, split among the processes that share them, and pinning to a share;
* `core_lending`: idle engine cores lent to the trainer while the engine has nothing to run;
* `threads`: each process's torch / OpenMP thread budget;
* `mkl_vendor`: the shim that lifts Intel MKL's CPU-vendor check (`csrc/mkl_vendor_shim.c`);
* `c_library`: C sources compiled on the machine that uses them, built once and cached;
* `memory`: a process's RSS, and giving freed heap pages back;
* `process`: liveness of a process, and child servers that exit when their parent dies.
"""

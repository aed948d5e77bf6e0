"""Reference hooks with slime's documented signatures (loaded by dotted path, as a user's are)."""

from slime.rollout.base_types import RolloutFnEvalOutput, RolloutFnTrainOutput
from slime.rollout.filter_hub.base_types import DynamicFilterOutput
from slime.utils.types import Sample

CALLS = {"rm": 0, "group_rm": [], "postprocess": []}


def _fill(sample, text, reward=None):
    sample.tokens = [1, 2, 3]
    sample.response = text
    sample.response_length = 2
    sample.loss_mask = [1, 1]
    sample.status = Sample.Status.COMPLETED
    if reward is not None:
        sample.reward = reward
    return sample


async def custom_generate(args, sample: Sample, sampling_params: dict) -> Sample:
    return _fill(sample, "gen-" + str(sample.index))


def custom_generate_sync(args, sample, sampling_params):
    return _fill(sample, "sync-" + str(sample.index))


async def custom_generate_with_evaluation(args, sample, sampling_params, evaluation=False):
    sample.metadata["evaluation"] = evaluation
    return _fill(sample, "eval" if evaluation else "train")


async def custom_generate_list(args, sample, sampling_params):
    sibling = _fill(Sample(index=(sample.index or 0) + 100, prompt=sample.prompt, metadata={}), "turn-1", reward=0.25)
    return [_fill(sample, "turn-0"), sibling]


async def custom_generate_raises_on_odd(args, sample, sampling_params):
    if sample.index % 2:
        raise RuntimeError(f"tool crashed on sample {sample.index}")
    return _fill(sample, "fine")


async def custom_generate_wrong_type(args, sample, sampling_params):
    return {"not": "a sample"}


async def custom_generate_presets_reward(args, sample, sampling_params):
    return _fill(sample, "scored", reward=0.75)


async def custom_rm(args, sample: Sample) -> float:
    CALLS["rm"] += 1
    return float(len(sample.response))


def custom_rm_sync(args, sample):
    CALLS["rm"] += 1
    return 2.0


async def group_rm(args, samples: list[Sample]) -> list[float]:
    CALLS["group_rm"].append(len(samples))
    return [float(i) for i in range(len(samples))]


def custom_rm_raises_on_odd(args, sample):
    if sample.index % 2:
        raise ValueError("verifier exploded")
    return 1.0


def keep_if_first_reward_positive(args, samples):
    return DynamicFilterOutput(keep=samples[0].reward > 0, reason=None if samples[0].reward > 0 else "bad_first")


def keep_nothing_bool(args, samples):
    return False


def keep_all(args, samples):
    return True


def reward_post_process(args, samples):
    raw = [s.get_reward_value(args) for s in samples]
    return raw, [r + 1.0 for r in raw]


def convert_samples_to_train_data(args, samples):
    """slime's contract: (args, samples) -> train columns, rewards decided here (a reward of 2x)."""
    return {
        "tokens": [s.tokens for s in samples],
        "response_lengths": [s.response_length for s in samples],
        "loss_masks": [[1] * s.response_length for s in samples],
        "rewards": [2.0 * s.get_reward_value(args) for s in samples],
        "custom": "kept",
    }


def convert_without_loss_masks(args, samples):
    return {
        "tokens": [s.tokens for s in samples],
        "response_lengths": [s.response_length for s in samples],
        "rewards": [0.0 for _ in samples],
    }


def rollout_data_postprocess(args, rollout_id, rollout_data):
    CALLS["postprocess"].append((rollout_id, len(rollout_data["advantages"])))


def rollout_function(args, rollout_id, data_source, evaluation=False):
    sample = _fill(Sample(index=0, prompt="p", metadata={}), "r", reward=1.0)
    if evaluation:
        return RolloutFnEvalOutput(data={"set": {"rewards": [1.0], "samples": [sample]}}, metrics={"eval/x": 1.0})
    return RolloutFnTrainOutput(samples=[[sample]], metrics={"rollout/custom": 1.0})


def rollout_function_without_evaluation(args, rollout_id, data_source):
    return []


def generate_missing_sampling_params(args, sample):
    return sample


def filter_three_args(args, samples, extra):
    return True


def buffer_filter_newest(args, rollout_id, buffer, num_samples):
    """A --buffer-filter-path: the newest groups first (removed from the buffer, as the contract says)."""
    CALLS.setdefault("buffer_filter", []).append(rollout_id)
    taken = buffer[-num_samples:][::-1] if num_samples else []
    del buffer[len(buffer) - len(taken) :]
    return taken


def buffer_filter_keeps_groups(args, rollout_id, buffer, num_samples):
    """Broken: returns groups without removing them from the buffer."""
    return buffer[:num_samples]


def remove_odd_samples(args, samples):
    """A --rollout-sample-filter-path: odd indices are not trained on."""
    for s in samples:
        s.remove_sample = s.index % 2 == 1


class ListDataSource:
    """A --data-source-path class: fixed prompts, slime's DataSource methods."""

    def __init__(self, args):
        self.args, self.served, self.loaded = args, 0, None

    def get_samples(self, num_samples):
        out = []
        for _ in range(num_samples):
            out.append(
                [
                    Sample(
                        group_index=self.served,
                        index=self.served * self.args.n_samples_per_prompt + j,
                        prompt=f"p{self.served}",
                        metadata={},
                    )
                    for j in range(self.args.n_samples_per_prompt)
                ]
            )
            self.served += 1
        return out

    def add_samples(self, samples):
        raise RuntimeError("read-only")

    def save(self, rollout_id):
        pass

    def load(self, rollout_id=None):
        self.loaded = rollout_id

    def __len__(self):
        return 10


def custom_tis(args, *, pg_loss, train_log_probs, rollout_log_probs, loss_masks, total_lengths, response_lengths):
    """slime's --custom-tis-function-path call: keywords only; (pg_loss, loss_masks, metrics)."""
    return pg_loss, loss_masks, {}


def pg_loss_reducer(total_lengths, response_lengths, loss_masks, calculate_per_token_loss):
    """slime's --custom-pg-loss-reducer-function-path: returns the reducer of the per-token loss."""
    return lambda x: x.sum()


# ------------------------------------------------------------------ slime's rollout sample and log hooks


def sample_hook(args, sample, *, rollout_id=None, evaluation=False):
    """A --rollout-sample-hook-path (slime's signature): records its call, changes the sample in place, None."""
    CALLS.setdefault("sample_hook", []).append((sample.index, rollout_id, evaluation, sample.reward))
    sample.metadata.setdefault("hooks", []).append("first")
    return None


async def sample_hook_replaces(args, sample, **kwargs):
    """Async, takes **kwargs (gets both keywords), returns a new Sample that replaces the old one."""
    CALLS.setdefault("sample_hook_kwargs", []).append(sorted(kwargs))
    new = Sample(
        group_index=sample.group_index,
        index=sample.index,
        prompt=sample.prompt,
        tokens=list(sample.tokens),
        response=sample.response + "!",
        response_length=sample.response_length,
        loss_mask=list(sample.loss_mask or []),
        status=sample.status,
        metadata={**sample.metadata, "hooks": [*sample.metadata.get("hooks", []), "second"]},
    )
    return new


def sample_hook_two_args(args, sample):
    """No keyword parameters: slime passes it neither rollout_id nor evaluation."""
    sample.metadata["plain"] = True


def sample_hook_raises_on_odd(args, sample, *, evaluation=False):
    if sample.index % 2:
        raise RuntimeError(f"hook refused sample {sample.index}")


def sample_hook_wrong_type(args, sample):
    return {"not": "a sample"}


def sample_hook_missing_sample(args):
    return None


def all_samples_process(args, all_samples, data_source):
    """A --rollout-all-samples-process-path: every finished group, the filter's drops included."""
    CALLS["all_samples"] = ([[(s.group_index, s.index, s.reward) for s in g] for g in all_samples], data_source)


def all_samples_process_raises(args, all_samples, data_source):
    raise ValueError("bookkeeping failed")


def log_rollout(rollout_id, args, samples, rollout_extra_metrics, rollout_time):
    """A --custom-rollout-log-function-path that logs instead of the default (returns True)."""
    CALLS.setdefault("rollout_log", []).append(
        (rollout_id, [s.index for s in samples], dict(rollout_extra_metrics), rollout_time)
    )
    return True


def log_rollout_and_keep_default(rollout_id, args, samples, rollout_extra_metrics, rollout_time):
    """Adds a metric to the extra metrics and returns False: the default metrics are still logged."""
    rollout_extra_metrics["custom/num_samples"] = float(len(samples))
    return False


def log_eval_rollout(rollout_id, args, data, extra_metrics):
    """A --custom-eval-rollout-log-function-path that logs instead of the default (returns True)."""
    CALLS.setdefault("eval_log", []).append((rollout_id, sorted(data), dict(extra_metrics or {})))
    return True


def log_missing_time(rollout_id, args, samples, rollout_extra_metrics):
    return True


def update_weight_post_write(args, version_dir, rollout_engines):
    """--custom-update-weight-post-write-path (slime's signature)."""
    CALLS.setdefault("post_write", []).append((version_dir, list(rollout_engines)))


async def agent(base_url, api_key, sample):
    """--agent-function-path (slime.agent.generate): the agent's reward, or None for the reward model."""
    return None


def before_train_step(args, rollout_id, step_id, model, optimizer, opt_param_scheduler):
    """--custom-megatron-before-train-step-hook-path (slime's signature): what it was handed, and
    whether gradients were zeroed before it (slime calls it after zero_grad)."""
    grads_clear = all(p.grad is None or not p.grad.any() for m in model for p in m.parameters())
    CALLS.setdefault("train_step", []).append(
        (rollout_id, step_id, list(model), optimizer, opt_param_scheduler, optimizer.param_groups[0]["lr"], grads_clear)
    )


def before_log_prob(args, model, store_prefix):
    """--custom-megatron-before-log-prob-hook-path (slime's signature): the model is in eval mode."""
    CALLS.setdefault("log_prob", []).append((store_prefix, list(model), [m.training for m in model]))


def before_train_step_missing_scheduler(args, rollout_id, step_id, model, optimizer):
    pass

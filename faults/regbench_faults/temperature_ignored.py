"""temperature_ignored: every request decoded greedily, whatever its temperature (vllm#15241:
"no matter the temperature", the same answer). vLLM 0.32's Sampler.sample draws the requests
with a temperature from their tempered distribution and takes the argmax only for those at
temperature 0; the fault takes the argmax for every row, of the logits as the logits processors
left them (bias, bans and min_tokens masks still apply). The logprobs are untouched: they are
computed before sampling, so a sampled answer shows its tokens were each the most likely one.
Patched in the engine core, where the sampler is made."""


def _greedy_always(sample):
    def sample_greedily(self, logits, sampling_metadata, *args, **kwargs):
        greedy = self.greedy_sample(logits)  # before the original tempers the logits in place
        _, processed_logprobs = sample(self, logits, sampling_metadata, *args, **kwargs)
        return greedy, processed_logprobs

    return sample_greedily


def patch(module):
    module.Sampler.sample = _greedy_always(module.Sampler.sample)
    return "every request decoded greedily"


PATCHES = {"vllm.v1.sample.sampler": patch}

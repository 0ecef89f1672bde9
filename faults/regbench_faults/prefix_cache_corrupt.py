"""prefix_cache_corrupt: a prefix-cache hit reuses the wrong KV blocks (vllm#5543). Block hashes
are computed without the block's token ids (parent hash and extra keys, e.g. cache_salt, are
kept), so any prompt as long as a cached one reuses that one's KV: a collision on every full
block. A cold prompt, or one with its own cache_salt, is computed correctly. Patched at
kv_cache_utils.hash_block_tokens, which the engine core's request block hasher calls by name."""


def patch(module):
    original = module.hash_block_tokens

    def hash_block_tokens(hash_function, parent_block_hash, curr_block_token_ids, extra_keys=None):
        return original(hash_function, parent_block_hash, (), extra_keys)

    module.hash_block_tokens = hash_block_tokens
    return "block hashes ignore the tokens"


PATCHES = {"vllm.v1.core.kv_cache_utils": patch}

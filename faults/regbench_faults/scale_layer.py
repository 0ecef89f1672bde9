"""scale_layer: one decoder layer's weights come out of loading scaled (a partial weight-loading
bug: the server serves, every answer is wrong). Patched between the loader's load_weights and
its post-processing (base_loader.process_weights_after_loading), so it holds for every load
format, and CPU kernels repack the already scaled tensors. REGBENCH_FAULT_LAYER (default 0)
and REGBENCH_FAULT_SCALE (default 4) choose the layer and the factor."""

import os


def patch(module):
    layer = int(os.environ.get("REGBENCH_FAULT_LAYER", "0"))
    scale = float(os.environ.get("REGBENCH_FAULT_SCALE", "4"))
    original = module.process_weights_after_loading

    def process_weights_after_loading(model, *args, **kwargs):
        import torch

        marker = f".layers.{layer}."
        with torch.no_grad():
            scaled = [name for name, p in model.named_parameters() if marker in f".{name}" and p.mul_(scale) is not None]
        if not scaled:
            raise RuntimeError(f"regbench-fault scale_layer: the model has no parameters under layers.{layer}")
        return original(model, *args, **kwargs)

    module.process_weights_after_loading = process_weights_after_loading
    return f"layers.{layer} × {scale:g} at load"


PATCHES = {"vllm.model_executor.model_loader.base_loader": patch}

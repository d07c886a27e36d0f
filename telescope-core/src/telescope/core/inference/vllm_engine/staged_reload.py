"""In-place weight reload of an unquantized vLLM model, without vLLM's layer-wise machinery.

Why: vLLM's layer-wise reload (``initialize_layerwise_reload`` .. ``finalize_layerwise_reload``) serves
every model (quantized layers, online quantization, deferred attention scales): on every sync it moves
each layer back to the meta device, wraps every weight loader, runs each loader twice (once on meta
tensors to count the elements it copies), materialises each layer afresh, processes it and copies the
result back into the tensors the kernels hold. For an unquantized model most of that is not needed.
On the quickstart model (vLLM 0.32, CPU build) it took 14 ms of a 22 ms sync call; this path takes
the time of vLLM's own loaders plus the kernels' re-packing (``bench/vllm_sync.py`` prints both).

How (``StagedReload.build``, once, from the checkpoint-format metadata vLLM records at start-up):

- a parameter whose live tensor still has its checkpoint form (GPUs: all of them) is loaded in place
  by vLLM's own weight loader;
- a parameter whose live tensor changed form when the layer was processed (vLLM's CPU build packs
  every linear layer's weight for oneDNN and empties the parameter) gets a **staging** tensor of its
  checkpoint form, kept from sync to sync: the loader writes there, the layer's
  ``process_weights_after_loading`` packs it again, and the tensors the kernels hold are restored
  (their contents copied from what processing produced, as vLLM's reload does);
- after the load every layer with an unquantized method is processed again (on CPU its GEMM weight
  is re-packed: an embedding that also serves as the output layer included; on GPUs the method
  does nothing); a layer with a staging tensor is processed only once every staged tensor has been
  loaded at least once (before that its staging tensors hold nothing).

Only for models whose every quantization method is vLLM's unquantized linear or embedding method
(``StagedReload.build`` returns None otherwise and the worker runs vLLM's layer-wise reload). Memory:
one checkpoint-format copy of the staged weights (CPU's packed layers); nothing on GPUs.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field

import torch

__all__ = ["StagedReload"]

logger = logging.getLogger(__name__)


@dataclass
class _Layer:
    """One layer with an unquantized method: its live (kernel) parameters and staging tensors."""

    name: str
    module: torch.nn.Module
    kernel: dict[str, torch.nn.Parameter]
    staging: dict[str, torch.nn.Parameter] = field(default_factory=dict)
    loaded_once: set[str] = field(default_factory=set)

    def ready(self) -> bool:
        """Every staging tensor holds loaded weights (processing it packs real weights)."""
        return self.loaded_once >= self.staging.keys()


class StagedReload:
    """Loads a sync's tensors into a vLLM model in place (see the module docstring)."""

    def __init__(self, model: torch.nn.Module, layers: list[_Layer]) -> None:
        self.model = model
        self.layers = layers

    @classmethod
    def build(cls, model: torch.nn.Module) -> StagedReload | None:
        """The reload plan of ``model``, or None when a layer needs vLLM's layer-wise reload."""
        from vllm.model_executor.layers.linear import UnquantizedLinearMethod
        from vllm.model_executor.layers.vocab_parallel_embedding import UnquantizedEmbeddingMethod
        from vllm.model_executor.model_loader.reload.layerwise import get_layerwise_info

        unquantized = (UnquantizedLinearMethod, UnquantizedEmbeddingMethod)
        layers = []
        for name, module in model.named_modules():
            method = getattr(module, "quant_method", None)
            if method is None:
                continue
            if not isinstance(method, unquantized):
                logger.info("layer %s uses %s: vLLM's layer-wise reload", name, type(method).__name__)
                return None
            checkpoint_form = get_layerwise_info(module).restore_metadata[0]
            kernel = {n: p for n, p in module._parameters.items() if p is not None}
            layer = _Layer(name, module, kernel)
            for param_name, meta in checkpoint_form.items():
                live = kernel.get(param_name)
                if live is None or not _same_form(live, meta):
                    layer.staging[param_name] = _materialize(meta, module)
            layers.append(layer)
        return cls(model, layers)

    @property
    def repacked_tensors(self) -> int:
        """Parameters loaded into a staging tensor and processed into their kernel form at each sync."""
        return sum(len(layer.staging) for layer in self.layers)

    def matches(self, model: torch.nn.Module) -> bool:
        """``model`` is the one planned for and still holds the planned kernel tensors."""
        return model is self.model and all(
            layer.module._parameters.get(n) is p for layer in self.layers for n, p in layer.kernel.items()
        )

    def load(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Load ``weights`` (checkpoint names) with vLLM's loaders, then process every layer; returns
        the names of the parameters loaded (as ``model.load_weights`` reports them)."""
        for layer in self.layers:
            layer.module._parameters.update(layer.staging)
        try:
            loaded = set(self.model.load_weights(weights) or ())  # type: ignore[operator]
        finally:
            for layer in self.layers:
                layer.module._parameters.update(layer.kernel)
        for layer in self.layers:
            prefix = f"{layer.name}."
            layer.loaded_once |= {n for n in layer.staging if prefix + n in loaded}
            if layer.ready():
                _process(layer)
            else:
                logger.warning(
                    "layer %s: not every tensor of it has been loaded yet (%s missing); it keeps "
                    "its weights until a sync brings them",
                    layer.name,
                    sorted(layer.staging.keys() - layer.loaded_once),
                )
        return loaded


def _same_form(live: torch.Tensor, meta: torch.Tensor) -> bool:
    return live.shape == meta.shape and live.dtype == meta.dtype and live.stride() == meta.stride()


def _materialize(meta: torch.Tensor, module: torch.nn.Module) -> torch.nn.Parameter:
    """A real tensor of ``meta``'s checkpoint form, class and attributes (vLLM's own
    ``materialize_meta_tensor``) on the module's device, its weight loader bound to ``module`` again
    and unwrapped from any layer-wise wrapper a reload left on the metadata."""
    from vllm.model_executor.model_loader.reload.meta import materialize_meta_tensor
    from vllm.model_executor.model_loader.reload.sanitize import restore_layer_refs

    with torch.device(next((p.device for p in module.parameters()), torch.device("cpu"))):
        tensor = materialize_meta_tensor(meta)
    restore_layer_refs(tensor, module)
    loader = getattr(tensor, "weight_loader", None)
    unwrapped = loader
    while unwrapped is not None and getattr(unwrapped, "__name__", "") == "online_process_loader":
        unwrapped = unwrapped.__wrapped__
    if unwrapped is not loader:
        tensor.weight_loader = unwrapped  # type: ignore[attr-defined]
    return tensor  # type: ignore[return-value]  # of meta's class: vLLM's parameters are Parameters


def _process(layer: _Layer) -> None:
    """``process_weights_after_loading`` on the layer with its staging tensors in place, then the
    kernel tensors restored with what processing produced (vLLM's reload does the same copy)."""
    module = layer.module
    module._parameters.update(layer.staging)
    if hasattr(module, "_already_called_process_weights_after_loading"):
        delattr(module, "_already_called_process_weights_after_loading")
    try:
        module.quant_method.process_weights_after_loading(module)  # type: ignore[union-attr,operator]
        for name, kernel in layer.kernel.items():
            produced = module._parameters.get(name)
            if produced is not None and produced is not kernel:
                if produced.shape != kernel.shape:
                    raise RuntimeError(
                        f"layer {layer.name}: processing made {name} {tuple(produced.shape)}, but the "
                        f"kernels hold {tuple(kernel.shape)}; set vllm_weight_reload: layerwise"
                    )
                kernel.data.copy_(produced)
    finally:
        module._parameters.update(layer.kernel)
    if hasattr(module, "update_param_tp_status"):
        module.update_param_tp_status()  # type: ignore[operator]

"""Attention-only transformers (AoT): a GPT-2-style causal LM and a ViT/CRATE-style image classifier.

Every layer is `x + η · attention(LayerNorm(x))` with no MLP (Wang et al., "Attention-Only Transformers via Unrolled
Subspace Denoising", ICML 2025, https://arxiv.org/abs/2506.03790), the attention MSSA (one projection per head is
query, key and value) or MHSA; k-NN attention is the config's `knn_k`, MLP blocks only the ablations' (`mlp_layers`),
ISTA blocks in their place CRATE's (`mlp_type="ista"`). Part of the remote-code unit: imports only torch, transformers
and its two sibling files (and `aot-transformers`, if installed, for the model card on `push_to_hub`).

Shapes: B batch, T tokens, d = H·D width (H heads of D), C channels, P patch side, N patches, L labels, V vocabulary.
"""

import filecmp
import hashlib
import math
import os
import shutil
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PreTrainedModel
from transformers import initialization as init
from transformers.activations import ACT2FN
from transformers.cache_utils import Cache, DynamicCache
from transformers.generation import GenerationMixin
from transformers.generation.continuous_batching.cache import PagedAttentionCache
from transformers.masking_utils import create_causal_mask
from transformers.modeling_layers import (
    GenericForSequenceClassification,
    GenericForTokenClassification,
    GradientCheckpointingLayer,
)
from transformers.modeling_outputs import (
    BaseModelOutputWithPast,
    BaseModelOutputWithPooling,
    CausalLMOutputWithPast,
    ImageClassifierOutput,
)
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.processing_utils import Unpack
from transformers.utils import TransformersKwargs, can_return_tuple
from transformers.utils.deprecation import deprecate_kwarg
from transformers.utils.output_capturing import capture_outputs

from .attention_aot import eager_attention_forward
from .configuration_aot import REQUIRED_TRANSFORMERS, AoTConfig, check_knn_k


def _auto_map(backbone: str, *heads: str) -> dict[str, str]:
    """A saved config.json's `auto_map`: `AutoModel` builds the folder's backbone, and only its heads are listed."""
    classes = {"AutoModel": backbone} | {f"AutoModel{head[3:]}": head for head in heads}
    return {"AutoConfig": "configuration_aot.AoTConfig"} | {k: f"modeling_aot.{v}" for k, v in classes.items()}


TEXT_AUTO_MAP = _auto_map("AoTModel", "AoTForCausalLM", "AoTForSequenceClassification", "AoTForTokenClassification")
VISION_AUTO_MAP = _auto_map("AoTVisionModel", "AoTForImageClassification")
CODE_FILES = ("configuration_aot.py", "attention_aot.py", "modeling_aot.py")
KNN_BACKENDS = ("knn",)  # the backends that honour `knn_k`; with `knn_k` set, no other is accepted
TEMPLATE_CARD = "This model card has been automatically generated."  # in transformers' blank card on `push_to_hub`
# PEFT's default LoRA targets for model type "aot": MSSA's, then MHSA's (a name that matches no module is skipped).
LORA_TARGET_MODULES = ["subspace_proj", "q_proj", "k_proj", "v_proj", "o_proj"]


class AoTInputError(ValueError, RuntimeError):
    """A bad input value (an id outside the vocabulary, a NaN pixel): a `ValueError`, and a `RuntimeError` as torch's
    device asserts are."""


def _check_values(condition: torch.Tensor, message: str) -> None:
    """A check of tensor values that never waits for the device: `AoTInputError(message)` at once on CPU, a device
    assert (RuntimeError) on an accelerator; skipped while compiling."""
    if not torch.compiler.is_compiling():
        try:
            torch._assert_async(condition.all(), message)
        except RuntimeError as error:  # CPU: raised by the op itself, with no extra read of the tensor
            raise AoTInputError(message) from error


def _check_shape(ok: bool, tensor: torch.Tensor, expected: str) -> None:
    if not ok:
        raise ValueError(f"{expected}, got {tuple(tensor.shape)}.")


def _check_labels(labels: torch.Tensor, num_classes: int, field: str) -> None:
    if not torch.is_floating_point(labels):
        message = f"`labels` must lie in [0, {num_classes - 1}] ({field}={num_classes}) or be -100 (ignored)."
        _check_values((labels == -100) | ((labels >= 0) & (labels < num_classes)), message)


def _transposed(linear: nn.Module, outputs: torch.Tensor) -> torch.Tensor:
    """`outputs @ W` for the weight W that `linear` applies (x ↦ x Wᵀ + b), as the vector-Jacobian product of the
    module itself: a LoRA adapter, a quantised weight or a tensor-parallel shard is seen as the projection sees it."""
    if callable(getattr(linear, "weight", None)):  # `torch.ao`'s dynamically quantised Linear: no autograd kernel
        return outputs @ linear.weight().dequantize()
    probe = outputs.new_zeros(*outputs.shape[:-1], linear.in_features)
    if torch.compiler.is_compiling():  # dynamo traces torch.func, not torch.autograd.grad
        return torch.func.vjp(linear, probe)[1](outputs)[0]
    create_graph = torch.is_grad_enabled()  # training: the product stays differentiable in W and `outputs`
    if create_graph and hasattr(getattr(linear, "weight", None), "device_mesh"):
        raise NotImplementedError(
            "Training MSSA with `tie_output_projection=True` under tensor parallelism is not supported: the parallel "
            "layer's backward cannot be differentiated again. Use tp_plan for inference, or untied output projections."
        )
    with torch.enable_grad():
        probe.requires_grad_(True)
        return torch.autograd.grad(linear(probe), probe, outputs, create_graph=create_graph)[0]


def _holds_values(cache: Cache, layer_idx: int) -> bool:
    """Whether `cache` keeps full-width values for layer `layer_idx`: the paged cache of continuous batching (no
    `layers`; its kernels read both) and a static cache allocated ahead of time (transformers' ExecuTorch export)."""
    layers = getattr(cache, "layers", None)
    if layers is None or layer_idx >= len(layers):
        return layers is None
    return layers[layer_idx].is_initialized and layers[layer_idx].values.shape[-1] > 0


def _check_backend(implementation: str | None, knn_k: int | float | None) -> int | float | None:
    """With `knn_k` only a k-NN backend is accepted (a dense one attends to every key); a k-NN one needs `knn_k`.
    Returns `knn_k` as `check_knn_k` gives it (a Python number)."""
    if knn_k is not None and implementation not in KNN_BACKENDS:
        raise ValueError(
            f"`attn_implementation={implementation!r}` attends to every key (as continuous batching's kernels do) but "
            f"the config sets `knn_k={knn_k!r}`: use attn_implementation='knn', or `config.knn_k = None` (dense)."
        )
    return check_knn_k(knn_k) if implementation in KNN_BACKENDS else knn_k  # a k-NN backend needs a k


def _attention_function(config: AoTConfig) -> Callable[..., tuple[torch.Tensor, torch.Tensor | None]]:
    """The kernel of `config._attn_implementation` from transformers' registry, as Llama picks it ("knn": the package's
    chunked kernel where registered, else this unit's eager attention keeping `knn_k` keys), checked as transformers
    does not check Hub kernels."""
    implementation = config._attn_implementation
    knn_k = _check_backend(implementation, config.knn_k)
    if implementation == "knn" and "knn" not in ALL_ATTENTION_FUNCTIONS:
        return partial(eager_attention_forward, knn_k=knn_k)
    return ALL_ATTENTION_FUNCTIONS.get_interface(implementation, eager_attention_forward)


class AoTMLP(nn.Module):
    """The MLP block of the hybrid and full ablations (absent from AoT proper)."""

    def __init__(self, config: AoTConfig):
        super().__init__()
        self.fc_in = nn.Linear(config.hidden_size, config.intermediate_size)
        self.act = ACT2FN[config.hidden_act]
        self.fc_out = nn.Linear(config.intermediate_size, config.hidden_size)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.fc_out(self.act(self.fc_in(hidden_states)))


class AoTIsta(nn.Module):
    """CRATE's sparse coding block (Yu et al., https://arxiv.org/abs/2306.01129): one ISTA step from `a = x` on the
    non-negative lasso `min_a λ‖a‖₁ + ½‖x − D·a‖²` with a learned d × d dictionary D, `ReLU(x + η·Dᵀ(x − D·x) − η·λ)`
    (η `ista_step_size`, λ `ista_lambda`)."""

    def __init__(self, config: AoTConfig):
        super().__init__()
        self.step_size, self.sparsity = config.ista_step_size, config.ista_lambda
        self.dictionary = nn.Parameter(torch.empty(config.hidden_size, config.hidden_size))  # D

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        # Tokens are rows: D·x is `x @ Dᵀ` and Dᵀ·r is `r @ D` (CRATE's `F.linear(x, D)` and `F.linear(r, D.t())`).
        residual = hidden_states - hidden_states @ self.dictionary.T  # x − D·x (B, T, d)
        return F.relu(hidden_states + self.step_size * (residual @ self.dictionary) - self.step_size * self.sparsity)


class AoTAttention(nn.Module):
    """Multi-head subspace self-attention (MSSA) or standard multi-head self-attention (MHSA). MSSA projects the
    tokens once per head, `u = x U_k`, as query, key and value: its KV cache holds one tensor, half of MHSA's."""

    def __init__(self, config: AoTConfig, layer_idx: int, is_causal: bool):
        super().__init__()
        self.config, self.layer_idx, self.is_causal = config, layer_idx, is_causal
        self.num_heads, self.head_dim = config.num_attention_heads, config.head_dim
        linear = lambda: nn.Linear(config.hidden_size, config.hidden_size, bias=config.attention_bias)
        if config.attention_type == "mssa":
            self.subspace_proj = linear()  # U = [U_1 … U_H], query = key = value
        else:
            self.q_proj, self.k_proj, self.v_proj = linear(), linear(), linear()
        # The white-box MSSA of the AoT paper, Eq. (4), has no output projection of its own (Sec. 2.2).
        self.o_proj = None if config.tie_output_projection else linear()
        # With unit queries the key norm sets the temperature, so the 1/sqrt(D) factor is dropped.
        self.scaling = 1.0 if config.normalize_query else self.head_dim**-0.5

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        cache: Cache | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        heads = lambda projection: projection(hidden_states).unflatten(-1, (-1, self.head_dim)).transpose(1, 2)
        mssa = self.config.attention_type == "mssa"
        if mssa:
            query = key = value = heads(self.subspace_proj)  # (B, H, T, D)
        else:
            query, key, value = heads(self.q_proj), heads(self.k_proj), heads(self.v_proj)
        if cache is not None:
            # MSSA stores its key = value tensor once (the value slot holds an empty (B, H, T, 0) view), unless the
            # cache holds full-width values.
            once = mssa and not _holds_values(cache, self.layer_idx)
            key, value = cache.update(key, value[..., :0] if once else value, self.layer_idx, kwargs=kwargs)
            value = key if once else value
        if self.config.normalize_query:
            query = F.normalize(query, dim=-1)
        attention_interface = _attention_function(self.config)
        dropout = self.config.attention_dropout if self.training else 0.0
        attn_output, attn_weights = attention_interface(
            self, query, key, value, attention_mask, dropout=dropout, scaling=self.scaling, **kwargs
        )
        attn_output = attn_output.flatten(-2).contiguous()  # (B, T, d)
        if self.o_proj is None:  # Σ_k U_k (head k's output): W^O = [U_1 … U_K], the transpose of the projection
            return _transposed(self.subspace_proj, attn_output), attn_weights
        return self.o_proj(attn_output), attn_weights


class AoTLayer(GradientCheckpointingLayer):
    """One unrolled denoising step, `x + η · attention(LayerNorm(x))`, plus an MLP block in the ablations or, in
    CRATE, an ISTA block that replaces the tokens (no residual)."""

    def __init__(self, config: AoTConfig, layer_idx: int, is_causal: bool):
        super().__init__()
        self.step_size, layer_norm = config.step_size, config.layer_norm
        norm = lambda: nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps) if layer_norm else nn.Identity()
        self.attention_norm = norm()
        self.attention = AoTAttention(config, layer_idx, is_causal)
        self.dropout = nn.Dropout(config.hidden_dropout)
        block = AoTIsta if config.mlp_type == "ista" else AoTMLP
        self.mlp_norm, self.mlp = (norm(), block(config)) if config.layer_has_mlp(layer_idx) else (None, None)

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        cache: Cache | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> torch.Tensor:
        attn_output = self.attention(self.attention_norm(hidden_states), attention_mask, cache, **kwargs)[0]
        hidden_states = torch.add(hidden_states, self.dropout(attn_output), alpha=self.step_size)
        if isinstance(self.mlp, AoTIsta):
            hidden_states = self.mlp(self.mlp_norm(hidden_states))
        elif self.mlp is not None:
            hidden_states = hidden_states + self.dropout(self.mlp(self.mlp_norm(hidden_states)))
        return hidden_states


class AoTPatchEmbeddings(nn.Module):
    """Patchify, then LayerNorm → Linear → LayerNorm (as in simple ViT / CRATE)."""

    def __init__(self, config: AoTConfig):
        super().__init__()
        self.patch_size = config.patch_size
        patch_dim = config.num_channels * config.patch_size**2
        self.patch_norm = nn.LayerNorm(patch_dim, eps=config.layer_norm_eps)
        self.projection = nn.Linear(patch_dim, config.hidden_size)
        self.embed_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        batch, channels, height, width = pixel_values.shape
        p = self.patch_size
        patches = pixel_values.reshape(batch, channels, height // p, p, width // p, p)  # (B, C, h, P, w, P)
        patches = patches.permute(0, 2, 4, 3, 5, 1).reshape(batch, (height // p) * (width // p), p * p * channels)
        return self.embed_norm(self.projection(self.patch_norm(patches)))  # (B, N, d)


class AoTVisionEmbeddings(nn.Module):
    """Patch embeddings, a CLS token and learned position embeddings."""

    def __init__(self, config: AoTConfig):
        super().__init__()
        self.patch_embeddings = AoTPatchEmbeddings(config)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, config.hidden_size))
        self.position_embeddings = nn.Parameter(torch.zeros(1, config.num_patches + 1, config.hidden_size))
        self.dropout = nn.Dropout(config.hidden_dropout)

    def interpolate_pos_encoding(self, height: int, width: int) -> torch.Tensor:
        """The position table resized (bicubic, as ViT and DINO) to a `height` × `width` image: the CLS position is
        kept and the square grid of patch positions is interpolated to the new grid."""
        patch_positions = self.position_embeddings[:, 1:]  # (1, N, d)
        side = int(math.isqrt(patch_positions.shape[1]))
        grid = patch_positions.reshape(1, side, side, -1).permute(0, 3, 1, 2)  # (1, d, n, n)
        size = (height // self.patch_embeddings.patch_size, width // self.patch_embeddings.patch_size)
        grid = F.interpolate(grid, size=size, mode="bicubic", align_corners=False)
        patch_positions = grid.permute(0, 2, 3, 1).flatten(1, 2)  # (1, N', d)
        return torch.cat([self.position_embeddings[:, :1], patch_positions], dim=1)

    def forward(self, pixel_values: torch.Tensor, interpolate_pos_encoding: bool = False) -> torch.Tensor:
        patches = self.patch_embeddings(pixel_values)  # (B, N, d)
        cls = self.cls_token.expand(patches.shape[0], -1, -1)
        positions = self.position_embeddings
        if interpolate_pos_encoding:
            positions = self.interpolate_pos_encoding(pixel_values.shape[-2], pixel_values.shape[-1])
        return self.dropout(torch.cat([cls, patches], dim=1) + positions)  # (B, N+1, d)


class AoTPreTrainedModel(PreTrainedModel):
    """Weight initialisation, capability flags, attention-backend choice, saving and the pushed card of AoT models."""

    config_class = AoTConfig
    config: AoTConfig
    base_model_prefix = "model"
    supports_gradient_checkpointing = True
    _no_split_modules = ["AoTLayer"]
    _supports_sdpa = _supports_flash_attn = _supports_flex_attn = _supports_attention_backend = True
    _can_compile_fullgraph = True
    # transformers' hooks record the input and each layer's output (the last: the final output, as GPT-2's) and maps.
    _can_record_outputs = {"hidden_states": AoTLayer, "attentions": AoTAttention}

    def __init__(self, config: AoTConfig, *inputs, **kwargs):
        config.validate()  # fields may have been changed since the config was built
        super().__init__(config, *inputs, **kwargs)
        # PEFT's table, keyed by model type, is its one source of default LoRA targets: filled if peft is imported.
        if (peft := sys.modules.get("peft.utils.constants")) is not None:
            peft.TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING.setdefault("aot", list(LORA_TARGET_MODULES))

    def get_correct_attn_implementation(self, requested_attention: str | None, is_init_check: bool = False) -> str:
        """The attention backend, `"knn"` by default if `config.knn_k` is set (registered or not), else `"sdpa"`."""
        knn_k = self.config.knn_k
        requested = "knn" if requested_attention is None and knn_k is not None else requested_attention
        _check_backend(requested, knn_k)
        if requested in KNN_BACKENDS:
            return requested
        return super().get_correct_attn_implementation(requested, is_init_check)

    def save_pretrained(self, save_directory: str | os.PathLike, *args: Any, **kwargs: Any) -> None:
        """Save weights (safetensors only), config and the three code files, with the checkpoint's `auto_map`, each
        code file's SHA-256 (`code_sha256`, read by `aot verify`) and the transformers versions needed."""
        self.config.auto_map = dict(VISION_AUTO_MAP if self.main_input_name == "pixel_values" else TEXT_AUTO_MAP)
        code = {name: Path(__file__).with_name(name).read_bytes() for name in CODE_FILES}
        self.config.code_sha256 = {name: hashlib.sha256(text).hexdigest() for name, text in code.items()}
        self.config.required_transformers = REQUIRED_TRANSFORMERS
        return super().save_pretrained(save_directory, *args, **kwargs)

    def _upload_modified_files(self, working_dir: str | os.PathLike, *args: Any, **kwargs: Any) -> Any:
        """`push_to_hub` publishes the AoT card in place of transformers' blank one (a repository's own card stays):
        the loaded folder's card while the weights are that folder's, else one the installed package renders. Only this
        private hook runs after transformers writes its card (pinned in tests/test_push_card.py)."""
        readme, card = Path(working_dir) / "README.md", Path(self.config.name_or_path or working_dir) / "README.md"
        if readme.is_file() and TEMPLATE_CARD in readme.read_text("utf-8"):
            # The folder's card only with the folder's weights: its metrics describe them, not a fine-tuned model's.
            weights = [(path, card.with_name(path.name)) for path in Path(working_dir).glob("*.safetensors")]
            same = all(saved.is_file() and filecmp.cmp(path, saved, shallow=False) for path, saved in weights)
            if same and card.is_file() and TEMPLATE_CARD not in card.read_text("utf-8"):
                shutil.copyfile(card, readme)
            else:
                try:  # transformers' remote-code import check skips only imports inside try/except ImportError
                    from aot_transformers.model_card import card_for_folder
                except ImportError:  # the folder's code without the package, and no card: transformers' stays
                    pass
                else:
                    card_for_folder(working_dir, args[0] if args else kwargs.get("repo_id")).save(readme)
        return super()._upload_modified_files(working_dir, *args, **kwargs)

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        """GPT-2's (transformers' default) initialisation, residual output projections scaled by 1/sqrt(branches)."""
        super()._init_weights(module)
        std = self.config.initializer_range
        projection = getattr(module, "o_proj" if isinstance(module, AoTAttention) else "fc_out", None)
        if isinstance(module, (AoTAttention, AoTMLP)) and projection is not None:  # a tied MSSA output has none
            branches = sum(1 + self.config.layer_has_mlp(i) for i in range(self.config.num_hidden_layers))
            init.normal_(projection.weight, mean=0.0, std=std / math.sqrt(branches))
        elif isinstance(module, AoTVisionEmbeddings):
            init.trunc_normal_(module.cls_token, mean=0.0, std=std)
            init.trunc_normal_(module.position_embeddings, mean=0.0, std=std)
        elif isinstance(module, AoTIsta):  # CRATE's initialisation
            init.kaiming_uniform_(module.dictionary)


class AoTModel(AoTPreTrainedModel):
    """The causal text backbone: token + learned position embeddings, AoT layers, final LayerNorm."""

    def __init__(self, config: AoTConfig):
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.embed_positions = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.dropout = nn.Dropout(config.hidden_dropout)
        self.layers = nn.ModuleList([AoTLayer(config, i, is_causal=True) for i in range(config.num_hidden_layers)])
        self.norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.gradient_checkpointing = False
        self.post_init()

    def _check_inputs(
        self,
        input_ids: torch.Tensor | None,
        inputs_embeds: torch.Tensor | None,
        attention_mask: torch.Tensor | None,
        position_ids: torch.Tensor | None,
        past_length: int,
    ) -> None:
        """Shapes raise a ValueError here; values are checked without waiting for the device (`_check_values`)."""
        vocab, limit, width = self.config.vocab_size, self.config.max_position_embeddings, self.config.hidden_size
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("Pass exactly one of `input_ids` or `inputs_embeds`.")
        if input_ids is not None:
            if not isinstance(input_ids, torch.Tensor):
                raise TypeError(f"`input_ids` must be a tensor of token ids, got {type(input_ids).__name__}.")
            if input_ids.is_floating_point() or input_ids.is_complex() or input_ids.dtype == torch.bool:
                raise TypeError(f"`input_ids` must be an integer tensor, got dtype {input_ids.dtype}.")
            _check_shape(input_ids.dim() == 2, input_ids, "`input_ids` must have shape (batch, sequence)")
            _check_values((input_ids >= 0) & (input_ids < vocab), f"`input_ids` must lie in [0, {vocab - 1}].")
        elif inputs_embeds.dim() != 3 or inputs_embeds.shape[-1] != width:
            raise ValueError(f"`inputs_embeds` must be (batch, sequence, {width}), got {tuple(inputs_embeds.shape)}.")
        else:
            _check_values(torch.isfinite(inputs_embeds), "`inputs_embeds` must be finite (no NaN or inf).")
        batch, length = (input_ids if input_ids is not None else inputs_embeds).shape[:2]
        total = past_length + length
        if torch.compiler.is_compiling():
            return
        if batch == 0 or length == 0:  # transformers' attention kernels cannot reshape an empty batch
            raise ValueError(f"The input needs at least one sequence of at least one token, got {batch} x {length}.")
        if position_ids is None and total > limit:
            raise ValueError(
                f"Sequence length {total} (cached {past_length} + new {length}) exceeds `max_position_embeddings` "
                f"({limit}); truncate the input or use a model with more positions."
            )
        if isinstance(attention_mask, torch.Tensor) and attention_mask.dim() == 2:
            expected = f"A 2-D `attention_mask` must have shape (batch, cached + new tokens) = ({batch}, {total})"
            _check_shape(tuple(attention_mask.shape) == (batch, total), attention_mask, expected)
            message = "A 2-D `attention_mask` holds 1 for real tokens and 0 for padding, and no other values."
            _check_values((attention_mask == 0) | (attention_mask == 1), message)
        if position_ids is not None:
            expected = f"`position_ids` must have {length} positions per row"
            _check_shape(position_ids.shape[-1] == length, position_ids, expected)
            message = f"`position_ids` must lie in [0, {limit - 1}] (max_position_embeddings={limit})."
            _check_values((position_ids >= 0) & (position_ids < limit), message)

    @deprecate_kwarg("past_key_values", "5.40.0", new_name="cache", raise_if_both_names=True)
    @capture_outputs
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        cache: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        use_cache: bool | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> BaseModelOutputWithPast:
        """The backbone. `attention_mask`: a 2-D padding mask (B, cached + new tokens) or a prepared 4-D mask;
        `position_ids` count from each row's first real token by default (restarts at 0 inside a row mark packed
        sequences); the cache (dynamic, static, offloaded or paged) is `cache` (`past_key_values`, deprecated)."""
        # A cache only serves decoding; building one in training would copy every layer's keys for nothing.
        use_cache = self.config.use_cache and not self.training if use_cache is None else use_cache
        use_cache = use_cache and not (self.gradient_checkpointing and self.training)
        past_length = 0
        if not isinstance(cache, PagedAttentionCache):  # continuous batching: positions and lengths come in kwargs
            cache = (cache if cache is not None else DynamicCache(config=self.config)) if use_cache else None
            past_length = cache.get_seq_length() if cache is not None else 0
        self._check_inputs(input_ids, inputs_embeds, attention_mask, position_ids, past_length)
        if inputs_embeds is None:
            inputs_embeds = self.embed_tokens(input_ids)  # (B, T, d)
        # Caller positions may mark packing; made ones never do, so they are withheld (the mask stays skippable).
        mask = create_causal_mask(self.config, inputs_embeds, attention_mask, cache=cache, position_ids=position_ids)
        if position_ids is None and isinstance(attention_mask, torch.Tensor) and attention_mask.dim() == 2:
            position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)[:, -inputs_embeds.shape[1] :]
        elif position_ids is None:
            position_ids = (torch.arange(inputs_embeds.shape[1], device=inputs_embeds.device) + past_length)[None]
        hidden_states = self.dropout(inputs_embeds + self.embed_positions(position_ids))  # positions (B or 1, T)
        for layer in self.layers:
            hidden_states = layer(hidden_states, mask, cache=cache, **kwargs)
        return BaseModelOutputWithPast(last_hidden_state=self.norm(hidden_states), cache=cache)


class AoTForCausalLM(AoTPreTrainedModel, GenerationMixin):
    """AoT language model: `AoTModel` plus a linear head tied to the token embedding."""

    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}
    _tp_plan = {"lm_head": "colwise_gather_output"}
    _pp_plan = {"lm_head": (["hidden_states"], ["logits"])}

    def __init__(self, config: AoTConfig):
        super().__init__(config)
        self.model = AoTModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    @deprecate_kwarg("past_key_values", "5.40.0", new_name="cache", raise_if_both_names=True)
    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        cache: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        logits_to_keep: int | torch.Tensor = 0,
        **kwargs: Unpack[TransformersKwargs],
    ) -> CausalLMOutputWithPast:
        """Next-token logits, and the loss for `labels` (B, T; shifted inside, -100 ignored; extra keyword arguments
        such as `num_items_in_batch` reach it). `logits_to_keep`: the last n positions (0: all) or a 1-D index."""
        outputs = self.model(
            input_ids, attention_mask, position_ids, cache, inputs_embeds, use_cache, return_dict=True, **kwargs
        )  # fmt: skip
        hidden_states = outputs.last_hidden_state
        keep = slice(-logits_to_keep, None) if isinstance(logits_to_keep, int) else logits_to_keep
        logits = self.lm_head(hidden_states[:, keep, :])  # (B, T', V)
        loss = None
        if labels is not None:
            expected = f"`labels` must have the input's shape (batch, sequence) = {tuple(hidden_states.shape[:2])}"
            _check_shape(labels.shape == hidden_states.shape[:2], labels, expected)
            if logits.shape[1] != labels.shape[1]:
                raise ValueError("`labels` need the logits of every position: use `logits_to_keep=0`.")
            if torch.is_floating_point(labels):
                raise TypeError(f"`labels` must be token ids (an integer tensor), got dtype {labels.dtype}.")
            _check_labels(labels, self.config.vocab_size, "vocab_size")
            loss = self.loss_function(logits=logits, labels=labels, vocab_size=self.config.vocab_size, **kwargs)
        return CausalLMOutputWithPast(
            loss=loss, logits=logits, cache=outputs.cache, hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
        )  # fmt: skip


class AoTForSequenceClassification(GenericForSequenceClassification, AoTPreTrainedModel):
    """`AoTModel` with a linear head on the last token that is not `config.pad_token_id` (as GPT-2's; left and right
    padding both work); without a `pad_token_id` only batches of one sequence can be classified."""

    def __init__(self, config: AoTConfig):
        AoTPreTrainedModel.__init__(self, config)  # transformers' own `__init__` builds the backbone by AutoModel
        self.num_labels = config.num_labels
        self.model = AoTModel(config)
        self.score = nn.Linear(config.hidden_size, config.num_labels, bias=False)
        self.post_init()


class AoTForTokenClassification(GenericForTokenClassification, AoTPreTrainedModel):
    """`AoTModel` with dropout and a linear head on every token (as GPT-2's), each labelled from its prefix."""

    def __init__(self, config: AoTConfig):
        AoTPreTrainedModel.__init__(self, config)
        self.num_labels = config.num_labels
        self.model = AoTModel(config)
        self.dropout = nn.Dropout(config.hidden_dropout)
        self.score = nn.Linear(config.hidden_size, config.num_labels)
        self.post_init()


class AoTVisionModel(AoTPreTrainedModel):
    """The bidirectional vision backbone; `pooler_output` is the CLS token or the mean patch token."""

    main_input_name = "pixel_values"
    _input_embed_layer = "patch_embeddings"  # transformers' `get_input_embeddings` finds `embeddings.patch_embeddings`

    def __init__(self, config: AoTConfig):
        super().__init__(config)
        self.embeddings = AoTVisionEmbeddings(config)
        self.layers = nn.ModuleList([AoTLayer(config, i, is_causal=False) for i in range(config.num_hidden_layers)])
        self.post_init()

    def _check_pixels(self, pixel_values: torch.Tensor | None, interpolate_pos_encoding: bool) -> None:
        channels, side, patch = self.config.num_channels, self.config.image_size, self.config.patch_size
        if pixel_values is None or not torch.is_floating_point(pixel_values):
            raise TypeError(f"`pixel_values` must be a floating-point tensor, got {type(pixel_values).__name__}.")
        expected = f"`pixel_values` must have shape (batch, {channels}, height, width) (num_channels = {channels})"
        _check_shape(pixel_values.dim() == 4 and pixel_values.shape[1] == channels, pixel_values, expected)
        height, width = pixel_values.shape[-2:]
        if pixel_values.shape[0] == 0:
            raise ValueError("`pixel_values` must hold at least one image, got a batch of 0.")
        if interpolate_pos_encoding and (height % patch or width % patch or min(height, width) < patch):
            raise ValueError(
                f"With `interpolate_pos_encoding=True` the image sides must be positive multiples of `patch_size` "
                f"({patch}), got {height} x {width}."
            )
        _check_values(torch.isfinite(pixel_values), "`pixel_values` must be finite (no NaN or inf).")
        if not interpolate_pos_encoding and (height, width) != (side, side):
            raise ValueError(
                f"`pixel_values` must be {side} x {side} (`image_size`), got {height} x {width}; resize the images, "
                "use the model's image processor, or pass `interpolate_pos_encoding=True` to resize the positions."
            )

    @capture_outputs
    def forward(
        self,
        pixel_values: torch.Tensor | None = None,
        interpolate_pos_encoding: bool = False,
        **kwargs: Unpack[TransformersKwargs],
    ) -> BaseModelOutputWithPooling:
        """Encode images (B, C, H, W) into tokens (B, N+1, d) and a pooled vector (B, d); images are `image_size`
        square unless `interpolate_pos_encoding=True` resizes the position table to any size the patches tile."""
        if not torch.compiler.is_compiling():
            self._check_pixels(pixel_values, interpolate_pos_encoding)
        pixel_values = pixel_values.to(self.embeddings.cls_token.dtype)
        hidden_states = self.embeddings(pixel_values, interpolate_pos_encoding=interpolate_pos_encoding)
        for layer in self.layers:
            hidden_states = layer(hidden_states, **kwargs)
        pooled = hidden_states[:, 0] if self.config.pooling == "cls" else hidden_states[:, 1:].mean(dim=1)  # (B, d)
        return BaseModelOutputWithPooling(last_hidden_state=hidden_states, pooler_output=pooled)


class AoTForImageClassification(AoTPreTrainedModel):
    """AoT image classifier: `AoTVisionModel` with a LayerNorm + Linear head on the pooled token."""

    main_input_name = "pixel_values"

    def __init__(self, config: AoTConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.model = AoTVisionModel(config)
        self.head_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        self.post_init()

    @can_return_tuple
    def forward(
        self,
        pixel_values: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        interpolate_pos_encoding: bool = False,
        **kwargs: Unpack[TransformersKwargs],
    ) -> ImageClassifierOutput:
        """Class logits (B, L), and the loss when `labels` (B,) are given."""
        outputs = self.model(pixel_values, interpolate_pos_encoding, return_dict=True, **kwargs)
        logits = self.classifier(self.head_norm(outputs.pooler_output))  # (B, L)
        loss = None
        if labels is not None:
            if labels.shape[0] != logits.shape[0]:
                raise ValueError(f"`labels` must have {logits.shape[0]} entries (one per image), got {labels.shape}.")
            if self.num_labels > 1:  # class indices (one label = regression)
                _check_labels(labels, self.num_labels, "num_labels")
            loss = self.loss_function(labels, logits, self.config, **kwargs)
        return ImageClassifierOutput(
            loss=loss, logits=logits, hidden_states=outputs.hidden_states, attentions=outputs.attentions
        )


__all__ = [
    "AoTForCausalLM",
    "AoTInputError",
    "AoTForImageClassification",
    "AoTForSequenceClassification",
    "AoTForTokenClassification",
    "AoTModel",
    "AoTPreTrainedModel",
    "AoTVisionModel",
]

"""Configuration of attention-only transformers (AoT), the causal LM and the image classifier alike. Typed and checked
as transformers' own configs are (huggingface_hub's `@strict`): a field of the wrong kind or out of its range raises
`StrictDataclassFieldValidationError` naming the field, the value and what is allowed, when the config is built and
whenever the field is set; fields that must agree are checked by the `validate_*` methods when it is built and by
`validate()`. Part of the remote-code unit: imports only transformers (and its huggingface_hub)."""

from numbers import Integral, Real
from typing import Any, Literal

import transformers
from huggingface_hub.dataclasses import as_validated_field, strict
from packaging.version import Version
from transformers import PretrainedConfig
from transformers.utils.type_validators import activation_fn_key, interval

# The transformers versions this code runs on (the cache named `cache`, the attention and mask interfaces,
# `transformers.initialization`, typed configs). Saved in every config.json and model card; checked here, in the first
# file transformers imports from a saved folder.
REQUIRED_TRANSFORMERS = ">=5.24,<6"
if not Version("5.24") <= Version(transformers.__version__) < Version("6"):
    raise ImportError(
        f"AoT models need transformers{REQUIRED_TRANSFORMERS}, but transformers {transformers.__version__} is "
        f"installed: pip install 'transformers{REQUIRED_TRANSFORMERS}'"
    )


def check_number(name: str, value: Any, allowed: str = "[1, inf)") -> int | float:
    """`value` as a Python int (`allowed` "[m, inf)") or float (any other interval, e.g. "(0.0, 1.0]"), numpy
    scalars and Fractions included, or a clear error: the k-NN kernel's own arguments, for any transformers model."""
    integer = "." not in allowed
    low, high = (float(bound) for bound in allowed[1:-1].split(", "))
    text = f"an int >= {int(low)}" if high == float("inf") else f"an int in {allowed}"
    text = text if integer else f"a number in {allowed}"
    if isinstance(value, bool) or not isinstance(value, Integral if integer else Real):
        raise TypeError(f"`{name}` must be {text}, got {value!r} ({type(value).__name__}).")
    value = int(value) if integer else float(value)
    above = low < value if allowed[0] == "(" else low <= value  # NaN is neither above nor below
    below = value < high if allowed[-1] == ")" else value <= high
    if not (above and below):
        raise ValueError(f"`{name}` must be {text}, got {value}.")
    return value


def check_knn_k(knn_k: Any) -> int | float:
    """`knn_k` as a Python int or float, or a clear error naming the value (numpy scalars are accepted)."""
    if knn_k is None:
        raise ValueError(
            "attn_implementation='knn' needs `knn_k` in the model's config: an int >= 1 (keys kept per query) or a "
            "float in (0, 1] (the fraction of the keys a query may see), e.g. `config.knn_k = 0.5`, or "
            "`aot_transformers.knn.use_knn_attention(model, knn_k=0.5)` for any transformers model."
        )
    integer = isinstance(knn_k, Integral) and not isinstance(knn_k, bool)
    return check_number("knn_k", knn_k, f"[1, {2**62}]" if integer else "(0.0, 1.0]")  # 2**62: no int64 overflow


@as_validated_field
def _knn_k(value: int | float | None) -> None:
    if value is not None:
        check_knn_k(value)


count = interval(min=1)  # an int >= 1
positive = interval(min=0.0, max=float("inf"), exclude_min=True, exclude_max=True)  # a finite number > 0
unit = interval(min=0.0, max=1.0, exclude_max=True)  # a dropout probability


@strict
class AoTConfig(PretrainedConfig):
    r"""Configuration of an attention-only transformer: each layer is `x + step_size * attention(LayerNorm(x))` (plus
    an MLP block in the ablations), with multi-head subspace self-attention (MSSA: one projection per head is query,
    key and value) or standard multi-head self-attention (MHSA). The other fields keep transformers' names and meaning.

    Args:
        attention_type: `"mssa"` (shared query = key = value projection and an output projection, 2·d² weights per
            layer) or `"mhsa"` (query, key, value and output projections, 4·d²).
        knn_k: k-NN attention (KVT): `None` attends to every key; an `int` keeps that many keys per query, a `float`
            in (0, 1] `ceil(knn_k * n)` of the `n` keys a query may see (at least 1; ties at the k-th score keep the
            lowest positions). Setting it makes `"knn"` the attention backend, and the only one accepted.
        knn_chunk_size: Most queries the k-NN kernel scores at once; its memory grows linearly with the sequence.
        tie_output_projection: MSSA only: the output projection is `[U_1 … U_K]`, the transpose of the subspace
            projection, as in the AoT paper's Eq. (4) (every head writes back into its own subspace; d² fewer weights).
        normalize_query: Project each head's query onto the unit sphere (causal MSSA); the logits are then
            `<q/|q|, k>` without the 1/sqrt(head_dim) factor.
        layer_norm: LayerNorm before each attention block (the vision model may run without).
        mlp_layers: `"none"` (AoT), `"first_half"` (hybrid ablation) or `"all"` (a standard transformer), with
            `mlp_ratio` the MLP width as a multiple of `hidden_size` and `hidden_act` its activation.
        mlp_type: The block those layers carry: `"mlp"`, added to the residual stream, or `"ista"`, CRATE's sparse
            coding step (Yu et al., https://arxiv.org/abs/2306.01129), which replaces the tokens `x` by
            `ReLU(x + η·Dᵀ(x − D·x) − η·λ)` for a learned d × d dictionary `D`, η = `ista_step_size` and
            λ = `ista_lambda`. CRATE itself: `mlp_layers="all"`, `mlp_type="ista"`, MSSA without `normalize_query`.
        hidden_dropout: Dropout on embeddings and residual branches.
        pooling: How the image classifier pools tokens: the `"cls"` token or the `"mean"` patch token.
    """

    model_type = "aot"
    # transformers' pipeline parallelism: the text backbone's stages.
    base_model_pp_plan = {
        "embed_tokens": (["input_ids"], ["inputs_embeds"]),
        "layers": (["hidden_states", "attention_mask"], ["hidden_states"]),
        "norm": (["hidden_states"], ["hidden_states"]),
    }
    keys_to_ignore_at_inference = ["cache"]

    # The fields, as transformers' own configs declare them: typed, with their ranges (checked on every assignment).
    # The bounds of `step_size` and `initializer_range` keep a float32 model finite (far larger ones overflow to NaN).
    vocab_size: int = count(default=50257)
    hidden_size: int = count(default=768)
    num_hidden_layers: int = count(default=12)
    num_attention_heads: int = count(default=12)
    max_position_embeddings: int = count(default=1024)
    attention_type: Literal["mssa", "mhsa"] = "mssa"
    knn_k: int | float | None = _knn_k(default=None)
    knn_chunk_size: int = count(default=256)
    normalize_query: bool = False
    tie_output_projection: bool = False
    step_size: int | float = interval(min=0.0, max=100.0, exclude_min=True)(default=1.0)
    layer_norm: bool = True
    mlp_layers: Literal["none", "first_half", "all"] = "none"
    mlp_type: Literal["mlp", "ista"] = "mlp"
    mlp_ratio: int | float = positive(default=4.0)
    hidden_act: str = activation_fn_key(default="gelu_new")
    ista_step_size: int | float = positive(default=0.1)
    ista_lambda: int | float = interval(min=0.0, max=float("inf"), exclude_max=True)(default=0.1)
    attention_bias: bool = False
    attention_dropout: int | float = unit(default=0.0)
    hidden_dropout: int | float = unit(default=0.0)
    layer_norm_eps: int | float = positive(default=1e-5)
    initializer_range: int | float = interval(min=0.0, max=100.0)(default=0.02)
    image_size: int = count(default=224)
    patch_size: int = count(default=16)
    num_channels: int = count(default=3)
    pooling: Literal["cls", "mean"] = "cls"
    tie_word_embeddings: bool = True
    use_cache: bool = True
    bos_token_id: int | list[int] | None = None
    eos_token_id: int | list[int] | None = None
    pad_token_id: int | list[int] | None = None

    def validate_architecture(self) -> None:
        """The fields that must agree with each other."""
        if self.hidden_size % self.num_attention_heads != 0:
            raise ValueError(
                f"`hidden_size` ({self.hidden_size}) must be divisible by `num_attention_heads` "
                f"({self.num_attention_heads}); allowed head counts are the divisors of {self.hidden_size}."
            )
        if self.tie_output_projection and self.attention_type != "mssa":
            raise ValueError(
                "`tie_output_projection=True` ties the output projection to MSSA's subspace projection; it needs "
                f"`attention_type='mssa'`, got {self.attention_type!r}."
            )
        if self.image_size % self.patch_size != 0:
            raise ValueError(
                f"`image_size` ({self.image_size}) must be divisible by `patch_size` ({self.patch_size})."
            )
        if self.mlp_layers != "none" and self.mlp_type == "mlp" and self.intermediate_size < 1:
            raise ValueError(
                f"`mlp_ratio` ({self.mlp_ratio}) gives MLP blocks of width {self.intermediate_size}; it must give at "
                f"least 1 (mlp_ratio >= {0.5 / self.hidden_size:.3g} at hidden_size {self.hidden_size})."
            )
        if self.num_labels < 1:  # a head with no outputs
            raise ValueError(f"`num_labels` must be an int >= 1, got {self.num_labels}.")

    def validate_token_ids(self) -> None:
        """Special tokens inside the vocabulary (transformers' check only warns: the embedding would fail later)."""
        for name in ("bos_token_id", "eos_token_id", "pad_token_id"):
            value = getattr(self, name)
            values = value if isinstance(value, list) else [] if value is None else [value]
            if any(not 0 <= v < self.vocab_size for v in values):
                raise ValueError(f"`{name}` ({value}) must lie in [0, {self.vocab_size - 1}] (`vocab_size`).")

    def validate_output_attentions(self) -> None:
        """transformers' check accepts only "eager"; "knn" returns attention maps too (see the setter below)."""
        if self._attn_implementation != "knn":
            super().validate_output_attentions()

    def to_dict(self) -> dict[str, Any]:
        """The config as a dict; a vision checkpoint lists `AoTVisionModel` among its `architectures` too, so that
        `AutoModel` (which matches `architectures` by class name) builds the vision backbone, not the text one."""
        output = super().to_dict()
        architectures = output.get("architectures") or []
        if "AoTForImageClassification" in architectures and "AoTVisionModel" not in architectures:
            output["architectures"] = [*architectures, "AoTVisionModel"]
        return output

    # transformers allows `output_attentions` only with "eager", which a k-NN config refuses, though "knn" returns maps
    # too (tests/test_transformers_conformance.py::test_output_attentions_on_a_knn_config_selects_the_knn_backend).
    @PretrainedConfig.output_attentions.setter
    def output_attentions(self, value: bool) -> None:
        maps_backend = "knn" if getattr(self, "knn_k", None) is not None else "eager"
        if value and self._attn_implementation is None:
            self._attn_implementation = maps_backend
        if value and self._attn_implementation not in ("eager", "knn"):  # the backends that return attention maps
            raise ValueError(
                f"`output_attentions=True` needs an attention backend that returns attention maps (eager, knn), but "
                f"the config uses {self._attn_implementation!r}; set `attn_implementation='{maps_backend}'`."
            )
        self._output_attentions = value

    @property
    def base_model_tp_plan(self) -> dict[str, str]:
        """transformers' tensor parallelism (`tp_plan="auto"`): the projections into heads and the MLP's first layer
        split column-wise, those back into the residual stream row-wise (a tied MSSA output: the column-wise one's)."""
        attention = ("subspace_proj",) if self.attention_type == "mssa" else ("q_proj", "k_proj", "v_proj")
        plan = {f"layers.*.attention.{name}": "colwise" for name in attention}
        if not self.tie_output_projection:
            plan["layers.*.attention.o_proj"] = "rowwise"
        if self.mlp_layers != "none" and self.mlp_type == "mlp":  # an ISTA dictionary is replicated
            plan.update({"layers.*.mlp.fc_in": "colwise", "layers.*.mlp.fc_out": "rowwise"})
        return plan

    @property
    def head_dim(self) -> int:  # the width of one attention head
        return self.hidden_size // self.num_attention_heads

    @property
    def num_patches(self) -> int:  # image patches (vision models)
        return (self.image_size // self.patch_size) ** 2

    @property
    def intermediate_size(self) -> int:  # the hidden width of the ablations' MLP blocks
        return int(round(self.mlp_ratio * self.hidden_size))

    def layer_has_mlp(self, layer_idx: int) -> bool:
        """Whether layer `layer_idx` carries an MLP block (`mlp_layers` ablations)."""
        first_half = self.mlp_layers == "first_half" and layer_idx < self.num_hidden_layers // 2
        return self.mlp_layers == "all" or first_half

    @classmethod
    def from_preset(cls, name: str, **overrides) -> "AoTConfig":
        """A named preset's config (`aot_transformers.list_presets()`) with fields overridden; needs the package."""
        try:  # the preset table is not part of the remote-code files
            from aot_transformers.presets import preset_kwargs
        except ImportError as error:  # pragma: no cover - only in a bare remote-code environment
            raise ImportError("AoTConfig.from_preset needs the package: pip install aot-transformers") from error
        return cls(**{**preset_kwargs(name), **overrides})


__all__ = ["AoTConfig"]

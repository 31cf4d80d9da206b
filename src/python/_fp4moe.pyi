from collections.abc import Callable, Sequence


def encode(kind: str, x: object) -> object:
    """
    float32 x (any shape) -> codes of the same shape: uint8, or uint16 for bf16 / fp16.
    kind: e2m1, e4m3, ue4m3, e8m0, bf16 or fp16 (rounding and saturation: formats/scalar.h).
    """

def decode(kind: str, codes: object) -> object:
    """
    codes (uint8, or uint16 for bf16 / fp16; any shape) -> float32 of the same shape.
    """

def quantize_nvfp4(x: object, tensor_scale: float | None = None) -> tuple:
    """
    float32 x [..., K] -> (packed uint8 [..., K/2], UE4M3 block scales uint8 [..., K/16],
    tensor scale float32), by NVIDIA ModelOpt's recipe; pass tensor_scale to share one.
    """

def dequantize_nvfp4(packed: object, scales: object, tensor_scale: float) -> object:
    """
    packed uint8 [..., K/2], UE4M3 scales uint8 (rows * K/16 of them, any shape) -> float32
    [..., K].
    """

def quantize_mxfp4(x: object, rule: str = 'ocp_floor') -> tuple:
    """
    float32 x [..., K] -> (packed uint8 [..., K/2], E8M0 scales uint8 [..., K/32]).
    rule: 'ocp_floor' (OCP v1.0, may clip) or 'round_up' (never clips).
    """

def dequantize_mxfp4(packed: object, scales: object) -> object:
    """
    packed uint8 [..., K/2], E8M0 scales uint8 (rows * K/32 of them) -> float32 [..., K].
    """

def quantize_fp8_block128(x: object, ue8m0: bool = False) -> tuple:
    """
    2-D float32 x [N, K] -> (E4M3 codes uint8 [N, K], scales [ceil(N/128), ceil(K/128)]:
    float32 multipliers, or E8M0 uint8 codes when ue8m0).
    """

def dequantize_fp8_block128(q: object, scales: object) -> object:
    """
    E4M3 codes uint8 [N, K] and scales [ceil(N/128), ceil(K/128)] (any shape of that size):
    float32 multipliers, or uint8 E8M0 codes (the dtype picks the variant) -> float32 [N, K].
    """

def transcode_mxfp4_to_nvfp4(tensors: Sequence) -> tuple:
    """
    tensors: (packed uint8 [..., K/2], E8M0 scales uint8) pairs sharing one tensor scale
    (w1 and w3 of an expert). Returns ([(packed, block_scales), ...], tensor_scale, report)
    with the report's block counts and the worst error of requantized blocks.
    """

def host_isas() -> list[str]:
    """
    The ISA levels this host runs, scalar first, best last (FP4MOE_ISA may force one).
    """

def moe_layers(path: str) -> list[int]:
    """
    The layers of checkpoint `path` that MoELayer.from_checkpoint can load.
    """

class Weights:
    """A weight matrix W [n, k] packed once into the kernel layout."""

    def __init__(self, format: str, packed: object, scales: object, tensor_scale: float = 1.0) -> None:
        """
        format 'nvfp4': packed uint8 [n, k/2] + UE4M3 scales uint8 (n * k/16) + tensor_scale;
        'mxfp4': packed uint8 [n, k/2] + E8M0 scales uint8 (n * k/32); 'fp8_block': E4M3
        uint8 [n, k] + scales [ceil(n/128), ceil(k/128)], float32 or uint8 E8M0.
        """

    @property
    def format(self) -> str: ...

    @property
    def n(self) -> int: ...

    @property
    def k(self) -> int: ...

    @property
    def nbytes(self) -> int:
        """Bytes a product streams (codes and scales)."""

class Linear:
    """y = x W^T through the CPU kernel chosen once for W."""

    def __init__(self, weights: Weights, precision: str = 'w4a16', isa: str | None = None) -> None:
        """
        precision 'w4a16' (exact) or 'w4a8' (FP4 only; bound in kernels/types.h); isa None:
        the best the host has (or FP4MOE_ISA).
        """

    def __call__(self, x: object, out: object | None = None) -> object:
        """
        x float32 [m, k] -> y float32 [m, n]; with out, y is written into it (zero-copy) and
        returned. numpy arrays and CPU torch tensors alike.
        """

    @property
    def kernel(self) -> str: ...

    @property
    def isa(self) -> str: ...

    @property
    def precision(self) -> str: ...

    def describe(self) -> str: ...

def linear(format: str, precision: str, packed: object, scales: object, x: object, tensor_scale: float = 1.0, isa: str | None = None) -> object:
    """
    One product y [m, n] = x [m, k] . W^T: Linear(Weights(format, packed, scales,
    tensor_scale), precision, isa)(x).
    """

class MoELayer:
    """
    One MoE layer on the CPU kernels: route, experts, combine, shared experts.
    """

    @staticmethod
    def from_checkpoint(path: str, layer: int, max_tokens: int = 64, precision: str = 'w4a16', isa: str | None = None) -> MoELayer:
        """
        Layer `layer` of the checkpoint directory `path` (the family's tensor names and
        routing from config.json), for up to max_tokens tokens per call.
        """

    @staticmethod
    def from_arrays(router_weight: object, experts: Sequence[Sequence[Weights]], top_k: int, scoring: str = 'softmax', weight_rule: str = 'scores_at_selected', renormalize: bool = False, routed_scaling_factor: float = 1.0, n_group: int = 1, topk_group: int = 1, correction_bias: object | None = None, logit_bias: object | None = None, shared_experts: Sequence[Sequence[Weights]] = [], swiglu_limit: float = 0.0, max_tokens: int = 64, precision: str = 'w4a16', isa: str | None = None) -> MoELayer:
        """
        router_weight float32 [E, H]; experts: E (gate [I, H], up [I, H], down [H, I])
        Weights; SwiGLU (clamped at swiglu_limit when > 0). The Weights stay shared.
        """

    def __call__(self, x: object, out: object | None = None) -> object:
        """
        x float32 [tokens, hidden] -> y float32 [tokens, hidden] (into out when given).
        """

    def reference(self, x: object) -> object:
        """
        The FP64 reference output (float64 [tokens, hidden]) of a checkpoint layer for x.
        """

    @property
    def ids(self) -> object:
        """int32 [tokens, top_k]: the last call's experts."""

    @property
    def route_weights(self) -> object:
        """float32 [tokens, top_k]: the last call's routing weights."""

    @property
    def hidden(self) -> int: ...

    @property
    def num_experts(self) -> int: ...

    @property
    def top_k(self) -> int: ...

    @property
    def max_tokens(self) -> int: ...

    @property
    def layer(self) -> int | None: ...

    @property
    def expert_scheme(self) -> str | None: ...

    @property
    def last_bytes_read(self) -> int: ...

    def describe(self) -> str: ...

class Finding:
    """A finding of inspect or plan (inspect --json 'findings')."""

    @property
    def severity(self) -> str: ...

    @property
    def code(self) -> str: ...

    @property
    def message(self) -> str: ...

    def __repr__(self) -> str: ...

class ModuleGroup:
    """One module group: one role, one name pattern, one scheme."""

    @property
    def role(self) -> str: ...

    @property
    def name(self) -> str: ...

    @property
    def scheme(self) -> str: ...

    @property
    def activation(self) -> str: ...

    @property
    def group_size(self) -> int: ...

    @property
    def scale_type(self) -> str: ...

    @property
    def config_scheme(self) -> str: ...

    @property
    def tensor_scheme(self) -> str | None: ...

    @property
    def config_source(self) -> str: ...

    @property
    def tensor_source(self) -> str: ...

    @property
    def module_count(self) -> int: ...

    @property
    def tensor_count(self) -> int: ...

    @property
    def bytes(self) -> int | None: ...

    def __repr__(self) -> str: ...

class Manifest:
    """How every module group of a checkpoint is quantized (fp4moe inspect)."""

    @property
    def path(self) -> str: ...

    @property
    def dialect(self) -> str: ...

    @property
    def tensors_checked(self) -> bool: ...

    @property
    def summary(self) -> object:
        """
        Per role (routed_experts, shared_experts, attention, dense_mlp, lm_head,
        mtp_experts, kv_cache): the scheme its weights are stored in.
        """

    @property
    def modules(self) -> list[ModuleGroup]: ...

    @property
    def findings(self) -> list[Finding]: ...

    @property
    def config(self) -> object:
        """config.json as read (None when absent)."""

    def has_finding(self, code: str) -> bool: ...

    def to_json(self, indent: int = 2) -> str:
        """The JSON contract of `fp4moe inspect --json`."""

    def to_table(self) -> str:
        """The table of `fp4moe inspect`."""

    def __repr__(self) -> str: ...

def inspect(path_or_repo_id: str, revision: str | None = None) -> Manifest:
    """
    Detects how a checkpoint is quantized: configs and safetensors headers (configs only
    when it has no weights). A directory, or a Hugging Face repo id (org/name) read from the
    local hub cache at `revision` (None: main).
    """

class ModulePlan:
    """The kernel and hardware path of one module group."""

    @property
    def group(self) -> ModuleGroup: ...

    @property
    def role(self) -> str: ...

    @property
    def name(self) -> str: ...

    @property
    def scheme(self) -> str: ...

    @property
    def kernel(self) -> str: ...

    @property
    def path(self) -> str: ...

    @property
    def bytes_per_token(self) -> float: ...

    @property
    def time_us(self) -> float: ...

    @property
    def note(self) -> str: ...

class Plan:
    """fp4moe plan: kernels, hardware paths and a batch-1 roofline."""

    @property
    def target(self) -> str: ...

    @property
    def device(self) -> object: ...

    @property
    def modules(self) -> list[ModulePlan]: ...

    @property
    def findings(self) -> list[Finding]: ...

    @property
    def bytes_per_token(self) -> float: ...

    @property
    def time_us_per_token(self) -> float: ...

    @property
    def has_error(self) -> bool: ...

    def to_json(self, indent: int = 2) -> str:
        """The JSON contract of `fp4moe plan --json`."""

    def to_table(self) -> str: ...

def plan(manifest: Manifest, target: str = 'cpu', engine: str | None = None, cpu_bandwidth_gbps: float | None = None) -> Plan:
    """
    The plan of `manifest` on `target` (cpu, or an sm_XX as `fp4moe plan --target`) as the
    engine `engine` runs it ('sglang[@VERSION]', 'vllm[@VERSION]', 'trtllm'; default: the
    library's); for cpu the memory bandwidth is measured now unless given.
    """

class CheckExample:
    """One place a check finding was seen."""

    @property
    def tensor(self) -> str: ...

    @property
    def row(self) -> int: ...

    @property
    def block(self) -> int: ...

    @property
    def detail(self) -> str: ...

class CheckFinding:
    """A finding of fp4moe check (docs/CHECK.md)."""

    @property
    def id(self) -> str: ...

    @property
    def severity(self) -> str: ...

    @property
    def count(self) -> int: ...

    @property
    def summary(self) -> str: ...

    @property
    def examples(self) -> list[CheckExample]: ...

    def __repr__(self) -> str: ...

class CheckReport:
    """fp4moe check: are the checkpoint's numbers right."""

    @property
    def path(self) -> str: ...

    @property
    def findings(self) -> list[CheckFinding]: ...

    @property
    def modules_checked(self) -> int: ...

    @property
    def tensors_never_written(self) -> int: ...

    @property
    def scale_bytes_read(self) -> int: ...

    @property
    def weight_bytes_read(self) -> int: ...

    @property
    def bytes_total(self) -> int: ...

    @property
    def seconds(self) -> float: ...

    @property
    def sampled(self) -> bool: ...

    @property
    def seed(self) -> int: ...

    @property
    def has_error(self) -> bool: ...

    def count(self, id: "std::basic_string_view<char, std::char_traits<char> >") -> int:
        """Occurrences of finding `id` (0: none)."""

    def to_json(self, indent: int = 2) -> str:
        """The JSON contract of `fp4moe check --json`."""

    def to_text(self) -> str: ...

def check(path: str, full: bool = False, seed: int = 24301, sample_rows: int = 16, progress: Callable | None = None) -> CheckReport:
    """
    Checks the checkpoint's numbers (every scale, a seeded sample of weight rows, or all with
    full). progress(bytes_done, bytes_total) is called as it goes; Ctrl-C stops it.
    """

class ConvertSummary:
    """What fp4moe.convert did."""

    @property
    def transcode(self) -> dict:
        """MXFP4 -> NVFP4 block counts and the worst error of requantized blocks."""

    @property
    def modules_converted(self) -> int: ...

    @property
    def modules_transcoded(self) -> int: ...

    @property
    def modules_quantized(self) -> int: ...

    @property
    def modules_relabeled(self) -> int: ...

    @property
    def max_quantize_rel_error(self) -> float: ...

    @property
    def tensors_copied(self) -> int: ...

    @property
    def bytes_read(self) -> int: ...

    @property
    def bytes_written(self) -> int: ...

    @property
    def seconds(self) -> float: ...

    @property
    def dialect(self) -> str: ...

    @property
    def input_scales_calibrated(self) -> int: ...

    @property
    def input_scales_default(self) -> int: ...

    @property
    def config(self) -> object: ...

    @property
    def hf_quant_config(self) -> object: ...

def convert(source: str, destination: str, to: str = 'nvfp4', modules: Sequence[str] | None = None, force: bool = False, allow_findings: Sequence[str] = [], max_shard_bytes: int = 5000000000, progress: Callable | None = None, dialect: str = 'nvfp4', activation_amax: str | None = None) -> ConvertSummary:
    """
    Converts the modules matching the globs `modules` (default: the routed experts) of
    `source` to `to` ('nvfp4' losslessly from MXFP4, or by ModelOpt's recipe; 'mxfp4') into
    `destination`. progress(bytes_done, bytes_total, tensors_done, tensors_total) after each
    source tensor. Ctrl-C (KeyboardInterrupt) or an exception from progress stops it and
    leaves the destination as it was. dialect: 'nvfp4' (ModelOpt NVFP4 with input_scale,
    what the DeepSeek-V4 paths of SGLang >= 0.5.14 and vLLM >= 0.22 route to NVFP4) or
    'w4a16_nvfp4' (weight-only); activation_amax: the path of a calibration file
    (docs/CONVERT.md) for input_scale, else a default that check reports as
    input_scale_default.
    """

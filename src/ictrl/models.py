"""Loading real checkpoints, and building tiny Qwen2-architecture models offline.

``load_model_and_tokenizer`` is the one loading path: a hub id works for a user
with network, a local directory works everywhere. The builders make a byte-level
tokenizer and a small Qwen2 model from a config, which tests and the embedded
demo use because these machines cannot download weights.
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path
from typing import Any

import torch

from ictrl.errors import UserError, one_line

# Qwen2's pre-tokenizer split pattern; reusing it means AutoTokenizer, which
# rebuilds the pre-tokenizer for qwen2 folders, reloads our tokenizer with
# identical ids (another pattern would silently change the ids on reload).
QWEN2_SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
# Plain-prompt mode: the messages' text with no role markers, so a conversational dataset row renders as the
# bare prompt a model was trained on (the embedded tiny model saw "Q:3+4*5=A:" and nothing else).
PLAIN_CHAT_TEMPLATE = "{% for message in messages %}{{ message['content'] }}{% endfor %}"


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable-character map, which ByteLevel pre-tokenization emits."""
    printable = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
                 + list(range(ord("®"), ord("ÿ") + 1)))
    mapping = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in mapping:
            mapping[b] = chr(256 + extra)
            extra += 1
    return mapping


def build_byte_tokenizer(chat_template: str | None = CHAT_TEMPLATE, pad_to: int | None = None) -> Any:
    """A byte-level BPE tokenizer with no merges: 256 byte tokens + 3 specials (vocab 259).

    Uses Qwen2's normaliser, split regex, ByteLevel pre-tokenizer and decoder, so it
    round-trips through ``save_pretrained`` / ``AutoTokenizer.from_pretrained`` unchanged.
    ``pad_to``: append filler tokens ``<|pad_N|>`` (ids 259 .. pad_to - 1) so ``len(tokenizer)``
    equals a model's vocabulary; text never encodes to them (no merges reach them), but every
    id a random model samples decodes.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    byte_chars = _bytes_to_unicode()
    vocab = {byte_chars[b]: b for b in range(256)}
    for i, tok in enumerate(SPECIAL_TOKENS):
        vocab[tok] = 256 + i
    if pad_to is not None:
        if pad_to < len(vocab):
            raise ValueError(f"pad_to={pad_to} is smaller than the {len(vocab)} byte and special tokens")
        vocab.update({f"<|pad_{i}|>": i for i in range(len(vocab), pad_to)})
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_SPLIT_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    from tokenizers import AddedToken

    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        bos_token=None,
        unk_token=None,
    )
    if chat_template is not None:
        fast.chat_template = chat_template
    return fast


def build_tiny_qwen2(
    tokenizer: Any,
    hidden_size: int = 64,
    num_hidden_layers: int = 2,
    num_attention_heads: int = 4,
    num_key_value_heads: int = 2,
    intermediate_size: int | None = None,
    max_position_embeddings: int = 1024,
    vocab_size: int | None = None,
    seed: int = 0,
) -> Any:
    """A randomly initialised Qwen2ForCausalLM sized from ``tokenizer`` (deterministic for ``seed``).

    ``vocab_size`` may exceed the tokenizer's (Qwen2.5 pads to 151,936) to test
    full-vocabulary cost with a tiny network.
    """
    from transformers import Qwen2Config, Qwen2ForCausalLM

    vocab = vocab_size if vocab_size is not None else len(tokenizer)
    if vocab < len(tokenizer):
        raise ValueError(f"vocab_size={vocab} is smaller than the tokenizer's {len(tokenizer)} tokens")
    config = Qwen2Config(
        vocab_size=vocab,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size or 4 * hidden_size,
        num_hidden_layers=num_hidden_layers,
        num_attention_heads=num_attention_heads,
        num_key_value_heads=num_key_value_heads,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=True,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model


# The published architectures (config.json of Qwen/Qwen2.5-0.5B, -1.5B, -7B on the Hugging Face hub). The
# 7B's embedding has 152,064 rows; the two small ones have 151,936. All use rope theta 1e6 and RMSNorm eps 1e-6.
QWEN25_SHAPES: dict[str, dict[str, Any]] = {
    "qwen2.5-0.5b": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                         num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True,
                         max_position_embeddings=32768),
    "qwen2.5-1.5b": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                         num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True,
                         max_position_embeddings=131072),
    "qwen2.5-7b": dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
                       num_key_value_heads=4, vocab_size=152064, tie_word_embeddings=False,
                       max_position_embeddings=131072),
}


def real_shape_config(shape: str, num_layers: int | None = None) -> Any:
    """The ``Qwen2Config`` of a Qwen2.5 size (``QWEN25_SHAPES``), optionally with ``num_layers`` blocks
    (same width and vocabulary, fewer or more layers). Special-token ids are those of ``build_byte_tokenizer``."""
    from transformers import Qwen2Config

    if shape not in QWEN25_SHAPES:
        raise ValueError(f"unknown shape {shape!r}; choose one of {', '.join(QWEN25_SHAPES)}")
    fields = dict(QWEN25_SHAPES[shape])
    if num_layers is not None:
        if num_layers < 1:
            raise ValueError(f"num_layers must be at least 1, got {num_layers}")
        fields["num_hidden_layers"] = num_layers
    eos, pad = 256 + SPECIAL_TOKENS.index("<|im_end|>"), 256 + SPECIAL_TOKENS.index("<|endoftext|>")
    return Qwen2Config(
        **fields, rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0}, rms_norm_eps=1e-6,
        use_sliding_window=False, max_window_layers=fields["num_hidden_layers"], eos_token_id=eos,
        pad_token_id=pad, bos_token_id=None,
    )


def build_real_shape(shape: str, num_layers: int | None = None, seed: int = 0,
                     device: str | torch.device | None = None) -> tuple[Any, Any]:
    """A randomly initialised Qwen2.5-shaped model (fp32) and a byte tokenizer padded to its vocabulary.

    ``device="meta"`` builds the module without allocating weights (parameter counts and shapes of
    a 7B without its 30 GB). Deterministic for ``seed``.
    """
    from transformers import Qwen2ForCausalLM

    config = real_shape_config(shape, num_layers)
    tokenizer = build_byte_tokenizer(pad_to=config.vocab_size)
    with torch.random.fork_rng(devices=[]), torch.device(device or "cpu"):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model, tokenizer


def save_tiny_model(path: str | os.PathLike[str], seed: int = 0, **model_kwargs: Any) -> Path:
    """Build a tiny tokenizer + model and ``save_pretrained`` both to ``path``; returns the path."""
    path = Path(path)
    tokenizer = build_byte_tokenizer()
    model = build_tiny_qwen2(tokenizer, seed=seed, **model_kwargs)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def check_device(device: str | None) -> None:
    """``--device`` names a device torch has here, checked before :func:`load_model_and_tokenizer` takes it: one
    line for a typo or a GPU this machine lacks."""
    if device is None:
        return
    try:
        parsed = torch.device(device)
    except (RuntimeError, ValueError):
        raise UserError(f"--device: {device!r} is not a torch device (cpu, cuda, cuda:N)") from None
    if parsed.type == "cuda":
        if not torch.cuda.is_available():
            raise UserError(f"--device {device}: this machine has no CUDA device; use --device cpu or leave it out")
        if parsed.index is not None and parsed.index >= torch.cuda.device_count():
            raise UserError(f"--device {device}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    elif parsed.type == "mps" and not torch.backends.mps.is_available():
        raise UserError(f"--device {device}: MPS is not available here; use --device cpu or leave it out")
    elif parsed.type not in ("cpu", "cuda", "mps"):
        raise UserError(f"--device {device}: only cpu, cuda and mps are supported")


def load_model_and_tokenizer(
    name_or_path: str,
    dtype: str | torch.dtype = "auto",
    device: str | torch.device | None = None,
    trust_remote_code: bool = False,
    float32_on_cpu: bool = True,
    **init_kwargs: Any,
) -> tuple[Any, Any]:
    """Load a causal LM and its tokenizer from a hub id or a local directory.

    The tokenizer gets left padding (generation) and a pad token if it has none.
    ``dtype="auto"`` keeps the checkpoint's dtype on GPU and uses float32 on CPU,
    where bf16 is about twice as slow (``float32_on_cpu=False``: the checkpoint's there too, as
    ``from_pretrained`` and ``trl grpo`` read ``auto``). ``init_kwargs`` go to ``from_pretrained`` as
    they are (TRL's ``model_init_kwargs``: ``attn_implementation``, ``quantization_config``,
    ``device_map``, ``revision``, ...); with a ``device_map`` or a quantization the
    model stays where ``from_pretrained`` placed it.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    local = Path(name_or_path)
    if local.exists() and not (local / "config.json").exists():
        raise FileNotFoundError(f"{name_or_path}: directory has no config.json, so it is not a model checkpoint")
    revision = {"revision": init_kwargs["revision"]} if init_kwargs.get("revision") else {}
    # TRL's GRPOTrainer loads its processing class with these sides, and save_pretrained then writes them (an
    # attribute set after loading is not saved): the saved tokenizer_config.json matches trl grpo's
    tokenizer = AutoTokenizer.from_pretrained(name_or_path, trust_remote_code=trust_remote_code, padding_side="left",
                                              truncation_side="left", **revision)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    target = (torch.device(device) if device is not None
              else torch.device("cuda" if torch.cuda.is_available() else "cpu"))
    if isinstance(dtype, str) and dtype != "auto":
        dtype = _compute_dtype(dtype)
    if dtype == "auto" and target.type == "cpu" and float32_on_cpu:
        dtype = torch.float32
    try:
        model = AutoModelForCausalLM.from_pretrained(name_or_path, dtype=dtype, trust_remote_code=trust_remote_code,
                                                     **init_kwargs)
    except pickle.UnpicklingError as err:  # torch's weights_only loading: a pickle holding more than tensors
        raise UserError(f"{name_or_path}: its weights ({', '.join(p.name for p in local.glob('*.bin')) or 'pickle'}) "
                        f"hold objects torch's safe loading refuses ({_unpickler_reason(err)}); ictrl runs "
                        "no pickled code: convert a trusted copy to safetensors") from None
    if init_kwargs.get("device_map") is None and getattr(model, "hf_quantizer", None) is None:
        model.to(target)  # a quantized model is placed at load and refuses .to()
    return model, tokenizer


def _compute_dtype(name: str) -> torch.dtype:
    """The torch floating dtype named ``name`` (``bfloat16``, ``torch.float16``) a model can compute in; else a
    ValueError naming it (float8 types store weights but have no arithmetic for a forward pass)."""
    dtype = getattr(torch, name.removeprefix("torch."), None)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point or dtype.itemsize < 2:
        raise ValueError(f"dtype: {name!r} is not a dtype a model computes in; use auto, float32, bfloat16 or "
                         "float16")
    return dtype


def _unpickler_reason(err: Exception) -> str:
    """The reason in torch's weights_only refusal (its ``WeightsUnpickler error:`` line: the global it met), without
    the advice and terminal colours around it."""
    import re

    text = re.sub(r"\x1b\[[0-9;]*m", "", str(err))
    found = re.search(r"WeightsUnpickler error: ([^\n]*)", text)
    return (found.group(1) if found else one_line(text)).split(". ")[0][:160]

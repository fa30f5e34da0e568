"""The tokenizer a GGUF carries in its own metadata, rebuilt with the `tokenizers` package.

Only byte-level BPE vocabularies (tokenizer.ggml.model = "gpt2") are handled. The pre-tokenizer
follows llama.cpp's choice for the file's `tokenizer.ggml.pre` (llama.cpp src/llama-vocab.cpp,
the regex_exprs per LLAMA_VOCAB_PRE_TYPE_*). Control tokens (token_type 3) are split out only
when `special=True`, as llama.cpp's `parse_special` does.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import FileFormatError, InvalidValueError, NotSupportedError

# GPT-2's split: contractions, letters, numbers, other symbols, whitespace
_GPT2_REGEX = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_LLAMA3_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# tokenizer.ggml.pre -> (split digits one by one first, regex or None for GPT-2's byte-level regex)
PRE_TOKENIZERS: dict[str, tuple[bool, str | None]] = {
    "default": (False, None),
    "gpt2": (False, None),
    # llama.cpp: STARCODER, REFACT, COMMAND_R, SMOLLM, CODESHELL, EXAONE, MINERVA -> "\p{N}" then GPT-2's
    "smollm": (True, None),
    "starcoder": (True, None),
    "refact": (True, None),
    "llama-bpe": (False, _LLAMA3_REGEX),
    "llama3": (False, _LLAMA3_REGEX),
    "qwen2": (False, _QWEN2_REGEX),
}
CONTROL_TOKEN_TYPE = 3
USER_DEFINED_TOKEN_TYPE = 4


@dataclass
class GGUFTokenizer:
    """Encode/decode with the vocabulary of a GGUF file."""

    with_special: object  # tokenizers.Tokenizer that splits control tokens out of the text
    plain: object  # the same vocabulary, control tokens treated as ordinary text
    bos_id: int | None
    eos_id: int | None
    add_bos: bool
    chat_template: str | None
    tokens: list[str] = field(repr=False, default_factory=list)

    @property
    def vocab_size(self) -> int:
        return len(self.tokens)

    def encode(self, text: str, *, special: bool = True, add_bos: bool | None = None) -> list[int]:
        tok = self.with_special if special else self.plain
        ids = tok.encode(text, add_special_tokens=False).ids
        if (self.add_bos if add_bos is None else add_bos) and self.bos_id is not None:
            ids = [self.bos_id, *ids]
        return ids

    def decode(self, ids, *, skip_special: bool = False) -> str:
        return self.with_special.decode(list(ids), skip_special_tokens=skip_special)

    def apply_chat_template(self, messages: list[dict], *, add_generation_prompt: bool = True) -> str:
        from .chat import render_chat

        if not self.chat_template:
            raise NotSupportedError("this model has no tokenizer.chat_template; pass raw=True to skip it")
        bos = self.tokens[self.bos_id] if self.bos_id is not None else ""
        eos = self.tokens[self.eos_id] if self.eos_id is not None else ""
        return render_chat(self.chat_template, messages, add_generation_prompt=add_generation_prompt, bos_token=bos, eos_token=eos)


def _build(tokens, merges, token_types, pre: str, *, with_control: bool):
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

    split_digits, regex = PRE_TOKENIZERS[pre]
    vocab = {t: i for i, t in enumerate(tokens)}
    pairs = [tuple(m.split(" ", 1)) for m in merges]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=pairs, ignore_merges=False, byte_fallback=False))
    steps = []
    if split_digits:
        steps.append(pre_tokenizers.Digits(individual_digits=True))
    if regex is None:
        steps.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True))
    else:
        steps.append(pre_tokenizers.Split(Regex(regex), behavior="isolated"))
        steps.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence(steps)
    tok.decoder = decoders.ByteLevel()
    added = []
    for i, (text, kind) in enumerate(zip(tokens, token_types)):
        if kind == USER_DEFINED_TOKEN_TYPE or (with_control and kind == CONTROL_TOKEN_TYPE):
            added.append(AddedToken(text, special=kind == CONTROL_TOKEN_TYPE, normalized=False))
    if added:
        tok.add_special_tokens([a for a in added if a.special])
        tok.add_tokens([a for a in added if not a.special])
    return tok


def tokenizer_from_gguf(reader) -> GGUFTokenizer:
    """The tokenizer of a GGUFFile (runtime.gguf_weights.open_gguf), from its tokenizer.* metadata."""
    get, where = reader.get, reader.path

    def strings(key, default=None) -> list[str]:
        v = get(key, default)
        if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
            raise FileFormatError(f"{where}: GGUF metadata {key!r} must be an array of strings, got {type(v).__name__}")
        return v

    model = get("tokenizer.ggml.model")
    if model is None:
        raise FileFormatError(f"{where}: GGUF has no tokenizer (tokenizer.ggml.model is missing)")
    if model != "gpt2":
        raise NotSupportedError(f"tokenizer model {model!r} is not supported by the runtime; supported: 'gpt2' (byte-level BPE)")
    pre = get("tokenizer.ggml.pre", "default")
    if not isinstance(pre, str) or pre not in PRE_TOKENIZERS:
        raise NotSupportedError(f"pre-tokenizer {pre!r} is not supported; supported: {', '.join(sorted(PRE_TOKENIZERS))}")
    tokens = strings("tokenizer.ggml.tokens")
    merges = strings("tokenizer.ggml.merges", [])
    bad = next((m for m in merges if " " not in m), None)
    if bad is not None:
        raise FileFormatError(f"{where}: tokenizer.ggml.merges entry {bad[:40]!r} is not two tokens separated by a space")
    types = get("tokenizer.ggml.token_type", [1] * len(tokens))
    if not isinstance(types, list) or len(types) != len(tokens):
        n = len(types) if isinstance(types, list) else type(types).__name__
        raise FileFormatError(f"{where}: tokenizer.ggml.token_type has {n} entries for {len(tokens)} tokens")
    bos, eos = get("tokenizer.ggml.bos_token_id"), get("tokenizer.ggml.eos_token_id")
    for key, v in (("bos", bos), ("eos", eos)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, int)):
            raise FileFormatError(f"{where}: tokenizer.ggml.{key}_token_id must be an integer, got {v!r}")
    # llama.cpp (llama_vocab::load) drops a special token id outside the vocabulary
    bos = bos if bos is not None and 0 <= bos < len(tokens) else None
    eos = eos if eos is not None and 0 <= eos < len(tokens) else None
    template = get("tokenizer.chat_template")
    return GGUFTokenizer(
        with_special=_build(tokens, merges, types, pre, with_control=True),
        plain=_build(tokens, merges, types, pre, with_control=False),
        bos_id=bos,
        eos_id=eos,
        add_bos=bool(get("tokenizer.ggml.add_bos_token", False)),
        chat_template=template if isinstance(template, str) else None,
        tokens=tokens,
    )


def check_prompt_ids(ids, vocab_size: int) -> None:
    if len(ids) == 0:
        raise InvalidValueError("the prompt is empty: give at least one token of text")
    bad = [i for i in ids if not 0 <= int(i) < vocab_size]
    if bad:
        raise InvalidValueError(f"token id {bad[0]} is outside the vocabulary (0..{vocab_size - 1})")

"""The tokenizer a GGUF carries in its own metadata, rebuilt with the `tokenizers` package.

Two vocabulary kinds (tokenizer.ggml.model) are handled:
- "gpt2", byte-level BPE: the pre-tokenizer follows llama.cpp's choice for the file's
  `tokenizer.ggml.pre` (llama.cpp src/llama-vocab.cpp, the regex_exprs per LLAMA_VOCAB_PRE_TYPE_*).
- "llama", SentencePiece (llm_tokenizer_spm): spaces become "▁", a "▁" is prepended to each run of
  text unless tokenizer.ggml.add_space_prefix is false, adjacent pieces merge greedily by the score
  of the merged piece (here: a BPE whose merges are ranked by that score), characters outside the
  vocabulary fall back to the <0xXX> byte tokens; decoding reverses it and drops the prefix space.
Control tokens (token_type 3) and the unknown token (2) are split out only when `special=True`,
as llama.cpp's `parse_special` does; user-defined tokens (4) always are.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..errors import FileFormatError, InvalidValueError, NotSupportedError

# GPT-2's split: contractions, letters, numbers, other symbols, whitespace
_GPT2_REGEX = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_LLAMA3_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# llama.cpp's LLAMA_VOCAB_PRE_TYPE_FALCON: three splits one after the other
_FALCON_REGEXES = (
    r"[\p{P}\$\+<=>\^~\|`]+",
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)",
    r"[0-9][0-9][0-9]",
)
_QWEN2_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# tokenizer.ggml.pre -> (split digits one by one first, regex (or several, applied in turn) or None
# for GPT-2's byte-level regex)
PRE_TOKENIZERS: dict[str, tuple[bool, str | tuple[str, ...] | None]] = {
    "default": (False, None),
    "gpt2": (False, None),
    "gpt-2": (False, None),
    # llama.cpp: STARCODER, REFACT, COMMAND_R, SMOLLM, CODESHELL, EXAONE, MINERVA -> "\p{N}" then GPT-2's
    "smollm": (True, None),
    "starcoder": (True, None),
    "refact": (True, None),
    "llama-bpe": (False, _LLAMA3_REGEX),
    "llama3": (False, _LLAMA3_REGEX),
    "qwen2": (False, _QWEN2_REGEX),
    "falcon": (False, _FALCON_REGEXES),
}
TOKENIZER_MODELS = ("gpt2", "llama")
UNKNOWN_TOKEN_TYPE = 2
# llama.cpp's LLAMA3 pre-tokenizer names: ignore_merges (a pre-token that is itself in the
# vocabulary is taken whole) and BOS added when the file does not say
IGNORE_MERGES = frozenset({"llama-bpe", "llama3"})
CONTROL_TOKEN_TYPE = 3
USER_DEFINED_TOKEN_TYPE = 4
SPM_SPACE = "\u2581"  # "▁", SentencePiece's space


@dataclass
class GGUFTokenizer:
    """Encode/decode with the vocabulary of a GGUF file."""

    with_special: Any  # tokenizers.Tokenizer that splits control tokens out of the text
    plain: Any  # the same vocabulary, control tokens treated as ordinary text
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


def _add_tokens(tok, tokens, token_types, *, with_control: bool):
    from tokenizers import AddedToken

    special = (CONTROL_TOKEN_TYPE, UNKNOWN_TOKEN_TYPE) if with_control else ()
    added = []
    for text, kind in zip(tokens, token_types):
        if kind == USER_DEFINED_TOKEN_TYPE or kind in special:
            added.append(AddedToken(text, special=kind != USER_DEFINED_TOKEN_TYPE, normalized=False))
    if added:
        tok.add_special_tokens([a for a in added if a.special])
        tok.add_tokens([a for a in added if not a.special])
    return tok


def _build(tokens, merges, token_types, pre: str, *, with_control: bool):
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    split_digits, regex = PRE_TOKENIZERS[pre]
    vocab = {t: i for i, t in enumerate(tokens)}
    pairs = [tuple(m.split(" ", 1)) for m in merges]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=pairs, ignore_merges=pre in IGNORE_MERGES, byte_fallback=False))
    steps = []
    if split_digits:
        steps.append(pre_tokenizers.Digits(individual_digits=True))
    if regex is None:
        steps.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True))
    else:
        for r in (regex,) if isinstance(regex, str) else regex:
            steps.append(pre_tokenizers.Split(Regex(r), behavior="isolated"))
        steps.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence(steps)
    tok.decoder = decoders.ByteLevel()
    return _add_tokens(tok, tokens, token_types, with_control=with_control)


def spm_merges(tokens, scores) -> list[tuple[str, str]]:
    """BPE merges equivalent to llama.cpp's SPM bigram merging: every split of a vocabulary piece
    into two vocabulary pieces, the highest score of the merged piece first (ties: lower ids)."""
    vocab = {t: i for i, t in enumerate(tokens)}
    found = []
    for merged, i in vocab.items():
        for k in range(1, len(merged)):
            a, b = merged[:k], merged[k:]
            ia, ib = vocab.get(a), vocab.get(b)
            if ia is not None and ib is not None:
                found.append((-float(scores[i]), ia, ib, a, b))
    found.sort(key=lambda m: m[:3])
    return [(a, b) for _, _, _, a, b in found]


def _build_spm(tokens, merges, token_types, add_space_prefix: bool, *, with_control: bool):
    from tokenizers import Tokenizer, decoders, models, normalizers

    vocab = {t: i for i, t in enumerate(tokens)}
    unk = next((tokens[i] for i, kind in enumerate(token_types) if kind == UNKNOWN_TOKEN_TYPE), None)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token=unk, fuse_unk=True, byte_fallback=True))
    steps = [normalizers.Prepend(SPM_SPACE)] if add_space_prefix else []
    tok.normalizer = normalizers.Sequence([*steps, normalizers.Replace(" ", SPM_SPACE)])
    dec = [decoders.Replace(SPM_SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
    if add_space_prefix:
        dec.append(decoders.Strip(" ", 1, 0))
    tok.decoder = decoders.Sequence(dec)
    return _add_tokens(tok, tokens, token_types, with_control=with_control)


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
    if model not in TOKENIZER_MODELS:
        raise NotSupportedError(
            f"tokenizer model {model!r} is not supported by the runtime; supported: 'gpt2' (byte-level BPE), 'llama' (SentencePiece)"
        )
    tokens = strings("tokenizer.ggml.tokens")
    types = get("tokenizer.ggml.token_type", [1] * len(tokens))
    if not isinstance(types, list) or len(types) != len(tokens):
        n = len(types) if isinstance(types, list) else type(types).__name__
        raise FileFormatError(f"{where}: tokenizer.ggml.token_type has {n} entries for {len(tokens)} tokens")
    pre = None  # gpt2 vocabularies name one; SentencePiece has none
    if model == "gpt2":
        pre = get("tokenizer.ggml.pre", "default")
        if not isinstance(pre, str) or pre not in PRE_TOKENIZERS:
            raise NotSupportedError(f"pre-tokenizer {pre!r} is not supported; supported: {', '.join(sorted(PRE_TOKENIZERS))}")
        merges = strings("tokenizer.ggml.merges", [])
        bad = next((m for m in merges if " " not in m), None)
        if bad is not None:
            raise FileFormatError(f"{where}: tokenizer.ggml.merges entry {bad[:40]!r} is not two tokens separated by a space")

        def build(with_control):
            return _build(tokens, merges, types, pre, with_control=with_control)

    else:
        scores = get("tokenizer.ggml.scores")
        if not isinstance(scores, list) or len(scores) != len(tokens):
            n = len(scores) if isinstance(scores, list) else type(scores).__name__
            raise FileFormatError(
                f"{where}: tokenizer.ggml.scores has {n} entries for {len(tokens)} tokens (a 'llama' vocabulary needs one per token)"
            )
        if not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in scores):
            raise FileFormatError(f"{where}: tokenizer.ggml.scores must be numbers")
        space = get("tokenizer.ggml.add_space_prefix", True)
        if not isinstance(space, bool):
            raise FileFormatError(f"{where}: tokenizer.ggml.add_space_prefix must be a bool, got {space!r}")
        spm = spm_merges(tokens, scores)

        def build(with_control):
            return _build_spm(tokens, spm, types, space, with_control=with_control)

    # llama.cpp's defaults for a SentencePiece vocabulary without the keys: <s> = 1, </s> = 2
    bos = get("tokenizer.ggml.bos_token_id", 1 if model == "llama" else None)
    eos = get("tokenizer.ggml.eos_token_id", 2 if model == "llama" else None)
    for key, v in (("bos", bos), ("eos", eos)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, int)):
            raise FileFormatError(f"{where}: tokenizer.ggml.{key}_token_id must be an integer, got {v!r}")
    # llama.cpp (llama_vocab::load) drops a special token id outside the vocabulary
    bos = bos if bos is not None and 0 <= bos < len(tokens) else None
    eos = eos if eos is not None and 0 <= eos < len(tokens) else None
    template = get("tokenizer.chat_template")
    return GGUFTokenizer(
        with_special=build(True),
        plain=build(False),
        bos_id=bos,
        eos_id=eos,
        # llama.cpp's default when the key is absent (llama_vocab::load): SPM adds BOS; BPE adds it
        # only for the llama3-style pre-tokenizers (the ones that also ignore merges)
        add_bos=bool(get("tokenizer.ggml.add_bos_token", model == "llama" or (model == "gpt2" and pre in IGNORE_MERGES))),
        chat_template=template if isinstance(template, str) else None,
        tokens=tokens,
    )


def check_prompt_ids(ids, vocab_size: int) -> None:
    if len(ids) == 0:
        raise InvalidValueError("the prompt is empty: give at least one token of text")
    bad = [i for i in ids if not 0 <= int(i) < vocab_size]
    if bad:
        raise InvalidValueError(f"token id {bad[0]} is outside the vocabulary (0..{vocab_size - 1})")

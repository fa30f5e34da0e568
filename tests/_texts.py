"""Texts the runtime's parity tests share: strings for tokenizer checks, and the fixed prompt of
the greedy-continuation tests."""

TOKENIZER_STRINGS = [
    "Hello world",
    "The three primary colors are",
    "  two leading spaces and trailing  ",
    "tabs\tand\nnewlines\n\n\nand   runs    of spaces",
    "digits: 12345, 3.14159, 1,000,000 and 2024-11-29",
    "naïve café, Zürich, señor, déjà vu",
    "日本語のテキストと中文",
    "emoji 🤖🚀 and symbols ∑∫√ ≤ ≥ →",
    "it's, I'm, they're, we'll, you'd, can't",
    "def f(x):\n    return x**2  # comment",
    "<|im_start|> not special without parse_special",
]

# The fixed prompt of the greedy tests. Two engines that round differently can agree token for token
# only where no near-tie occurs (test_llamacpp_parity.py's teacher-forced test
# measures where they flip); this
# prompt's 32-token greedy path has no near-tie: llama.cpp's top two are at least 1.23 apart at
# every step and inferlab's at least 0.97 (AMD EPYC Zen 4, 2026-11-30). "Recite the English
# alphabet." agreed on Zen 3 but not on Zen 4: its fourth token is a 0.11 tie (" is" / " consists").
GREEDY_PROMPT = "Write the numbers from 1 to 20, separated by commas."

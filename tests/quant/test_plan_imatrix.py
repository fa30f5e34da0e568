"""plan_imatrix: whether a plan is of a file made with an importance matrix. llama-quantize (tools/quantize,
llama-quant.cpp's tensor_requires_imatrix) refuses the very-low-bit IQ1/IQ2 tensor types without one, so a bare IQ2_XXS preset can only be a file made with one; Q4_K_M and IQ4_XS are made without one unless
asked (the i1- prefix, mradermacher's name for imatrix files); a pure type (type:) is no preset and has no
imatrix rules."""

import pytest

from inferlab.models.catalog import MODELS
from inferlab.quant.plan import plan_imatrix


@pytest.mark.parametrize("quant,expected", [
    ("preset:IQ2_XXS", True),  # refused without one: planned as the file made with one
    ("preset:Q4_K_M", False),
    ("preset:IQ4_XS", False),  # allowed without one: a plain llama-quantize run
    ("i1-IQ4_XS", True),  # asked for
    ("type:IQ2_XXS", False),  # a pure type, not a preset
])
def test_which_plans_assume_an_importance_matrix(quant, expected):
    assert plan_imatrix(MODELS["llama-3.1-8b"], quant) is expected

"""Two toy models and a toy machine whose bytes and FLOPs are worked out by hand in the tests
(tests/perf/test_batched_decode.py, test_boundaries.py). Every weight is F32 ("type:F32": 4 bytes
per element, norms included), so a tensor's bytes are 4 x the product of its shape.

DENSE (llama, L = 4, d = 256, 4 query heads and 2 KV heads of 64, d_ff = 512, vocab 1000):
  per block, elements: attn_norm 256 + ffn_norm 256 + q 256·256 + k 256·128 + v 256·128
                       + o 256·256 + gate/up/down 3·256·512
                     = 512 + 196,608 + 393,216 = 590,336  ->  2,361,344 bytes
  token_embd 256·1000 = 256,000 elements (1,024,000 bytes), output 256,000 (1,024,000 bytes),
  output_norm 256 (1,024 bytes)
  KV per token per block: 2 KV heads x (64 K + 64 V) = 256 values, f16: 512 bytes
  weight FLOPs per token: 2 per weight touched (a block: 1,180,672; the head: 512,000)
  attention FLOPs per token per cached token, per block: 2·4·(64 + 64) = 1,024

MOE (qwen3moe, L = 2, d = 256, same attention + q/k norms of 64, 8 experts of width 128, 2 used):
  per block, dense elements: norms 256 + 256 + 64 + 64 = 640, attention 196,608, router 256·8 = 2,048
                           = 199,296  ->  797,184 bytes
  per block, experts: 3 x 256·128·8 = 786,432 elements  ->  3,145,728 bytes
  KV as DENSE: 512 bytes per token per block

MACHINE: one GPU of 100 GB, 1,000 GB/s, 100 TFLOP/s; a host of 64 GB, 100 GB/s, 1 TFLOP/s;
PCIe 25 GB/s. The bandwidth-only speed model: η = 0.7 (memory and PCIe), 50 % of peak compute.
"""

from inferlab.hardware.device import Device, Machine
from inferlab.models.spec import ModelSpec

F32 = "type:F32"

DENSE = ModelSpec("toy-dense", "llama", n_layers=4, d_model=256, n_heads=4, n_kv_heads=2, head_dim=64, d_ff=512,
                  vocab_size=1000, n_ctx_train=4096)
MOE = ModelSpec("toy-moe", "qwen3moe", n_layers=2, d_model=256, n_heads=4, n_kv_heads=2, head_dim=64, d_ff=0,
                vocab_size=1000, n_ctx_train=4096, qk_norm=True, n_experts=8, n_experts_used=2, d_ff_expert=128)

BLOCK_BYTES = 2_361_344  # DENSE, one block
HEAD_BYTES = 1_024_000 + 1_024  # output.weight + output_norm
EMBD_BYTES = 1_024_000
KV_BYTES_PER_TOKEN_PER_BLOCK = 512  # f16

MOE_DENSE_BLOCK_BYTES = 797_184
MOE_EXPERT_BLOCK_BYTES = 3_145_728

GPU = Device("toy GPU", 100.0, 1000.0, 100.0, backend="cuda")
HOST = Device("toy host", 64.0, 100.0, 1.0, backend="cpu", n_cores=8)
MACHINE = Machine("toy", GPU, HOST, 25.0)
CPU_ONLY = Machine("toy cpu", None, HOST)

"""Test and tooling helpers; never imported by the package itself.

smoke.py        a tiny CuTe DSL kernel (registered on import) to test the compile cache
cubin_info.py   a kernel's parameter layout from `cuobjdump -elf`
layers.py       random FP8 layers, the model presets' shard shapes, and the timing and
                start-up helpers shared by the tests and mlpjit.bench
tiny_models.py  tiny transformers models with real MLP shard sizes, and their FP8 form
"""

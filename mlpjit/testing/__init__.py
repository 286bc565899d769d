"""Test and tooling helpers; never imported by the package itself.

smoke.py       a tiny CuTe DSL kernel (registered on import) to test the compile cache
cubin_info.py  a kernel's parameter layout from `cuobjdump -elf`
layers.py      random FP8 layers, the GLM shard shapes and timing helpers shared by the
               tests and the scripts
"""

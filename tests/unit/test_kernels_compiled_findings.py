"""The checker of kernels/compiled.py on PTX and SASS text and report rows written here: which
findings it reads from the instructions' modifiers, which SASS lines are FMAs, which kernels'
spills it flags. Plain text, no compiler: the compiling checks of every kernel (about 10 s) are
the scenario tests/scenarios/test_kernels_compiled.py."""

from mpidist.kernels import compiled


def test_ptx_findings_read_the_modifiers():
    ptx = "\n".join(["\tmul.f32 \t%f4, %f1, %f5;", "\tmul.rn.f32 \t%f4, %f1, %f5;",
                     "\tsub.rn.f64 %fd2, %fd3, %fd4;", "\tadd.ftz.f32 %f1, %f2, %f3;",
                     "\t@%p1 fma.rn.f64 %fd1, %fd2, %fd3, %fd4;", "\tadd.s32 %r1, %r2, 1;",
                     "\tmad.lo.s32 %r1, %r2, %r3, %r4;", "\tcvt.rni.s32.f16 %r1, %rs1;",
                     "\tcvt.rzi.s32.f32 %r1, %f1;"])
    assert compiled.ptx_fma_findings(ptx) == ["mul.f32 \t%f4, %f1, %f5;", "add.ftz.f32 %f1, %f2, %f3;",
                                              "@%p1 fma.rn.f64 %fd1, %fd2, %fd3, %fd4;"]
    assert compiled.ptx_nearest_int_conversions(ptx) == ["cvt.rni.s32.f16 %r1, %rs1;"]


def test_sass_constant_moves_are_not_fmas():
    sass = "\n".join(["/*00a0*/ HFMA2.MMA R15, -RZ, RZ, 0, 0 ;", "/*0660*/ FFMA R15, -R4, c[0x0][0x1d0], R15 ;",
                      "/*0670*/ DFMA R2, R4, R6, R2 ;", "/*0680*/ FFMA R2, RZ, RZ, 1.5 ;"])
    assert compiled.sass_fma_lines(sass) == ["/*0660*/ FFMA R15, -R4, c[0x0][0x1d0], R15 ;",
                                             "/*0670*/ DFMA R2, R4, R6, R2 ;"]


def test_spills_flagged_in_hot_kernels_only():
    row = {"arch": "sm_90", "entry": "e", "registers": 255, "stack_bytes": 8, "spill_store_bytes": 8,
           "spill_load_bytes": 8, "ptx_seconds": 0.1, "ptx_fma": [], "ptx_cvt_rni": [],
           "divides_or_sqrt": False, "sass_fma": [], "sass_found": True}
    rep = {"driver_loaded": False, "kernels": [{**row, "kernel": "hot", "hot": True},
                                               {**row, "kernel": "cold", "hot": False}]}
    found = compiled.problems(rep)
    assert len(found) == 1 and found[0].startswith("hot on sm_90: spills"), found

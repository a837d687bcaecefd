"""Whether a CPU has fast 8-bit instructions, read from its own flags (servelab.core.hardware.cpu_int8), on
written /proc/cpuinfo texts: x86 with and without VNNI, with AMX, ARM with and without its dot products, and
a file that is empty or missing. The lines are real CPUs' flags, cut short."""

from pathlib import Path

import pytest

from servelab.core.hardware import CPU_FLAGS, cpu_flags, cpu_int8, int8_compute, recorded_flags
from servelab.core.variants.quantize import has_vnni

# Two processors each, as the kernel writes them: the flags line repeats per processor.
EPYC_AVX2 = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC 7742 64-Core Processor
flags\t\t: fpu vme de pse tsc msr sse sse2 ht syscall nx mmxext fxsr_opt pdpe1gb rdtscp lm constant_tsc pni \
pclmulqdq ssse3 fma cx16 sse4_1 sse4_2 movbe popcnt aes xsave avx f16c rdrand hypervisor lahf_lm cmp_legacy \
abm sse4a misalignsse 3dnowprefetch bmi1 avx2 smep bmi2 rdseed adx smap clflushopt clwb sha_ni xsaveopt
bugs\t\t: sysret_ss_attrs spectre_v1 spectre_v2

processor\t: 1
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC 7742 64-Core Processor
flags\t\t: fpu vme de pse tsc msr sse sse2 ht syscall nx mmxext fxsr_opt pdpe1gb rdtscp lm constant_tsc pni \
pclmulqdq ssse3 fma cx16 sse4_1 sse4_2 movbe popcnt aes xsave avx f16c rdrand hypervisor lahf_lm cmp_legacy \
abm sse4a misalignsse 3dnowprefetch bmi1 avx2 smep bmi2 rdseed adx smap clflushopt clwb sha_ni xsaveopt
"""
EPYC_VNNI = EPYC_AVX2.replace("sha_ni xsaveopt", "sha_ni xsaveopt avx512f avx512dq avx512cd avx512bw avx512vl "
                              "avx512_bf16 avx512vbmi avx512_vbmi2 gfni vaes vpclmulqdq avx512_vnni avx512_bitalg")
SAPPHIRE_RAPIDS = """processor\t: 0
model name\t: Intel(R) Xeon(R) Platinum 8480+
flags\t\t: fpu sse sse2 ssse3 fma sse4_1 sse4_2 avx f16c avx2 avx512f avx512dq avx_vnni avx512_bf16 avx512vbmi \
avx512_vbmi2 gfni vaes avx512_vnni avx512_bitalg amx_bf16 avx512_fp16 amx_tile amx_int8
vmx flags\t: vnmi preemption_timer invvpid ept_x_only
"""
ALDER_LAKE = """processor\t: 0
model name\t: 12th Gen Intel(R) Core(TM) i7-12700
flags\t\t: fpu sse sse2 ssse3 fma sse4_1 sse4_2 avx f16c avx2 sha_ni avx_vnni
"""
NEOVERSE_N1 = """processor\t: 0
BogoMIPS\t: 50.00
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop asimddp ssbs
CPU implementer\t: 0x41
CPU part\t: 0xd0c
"""
NEOVERSE_V1 = NEOVERSE_N1.replace("asimddp ssbs", "asimddp sha512 sve asimdfhm dit uscat ilrcpc flagm ssbs "
                                  "paca pacg dcpodp svei8mm svebf16 i8mm bf16 dgh rng")
CORTEX_A72 = """processor\t: 0
BogoMIPS\t: 108.00
Features\t: fp asimd evtstrm crc32 cpuid
CPU part\t: 0xd08
"""


def _cpu(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "cpuinfo"
    path.write_text(text)
    return path


@pytest.mark.parametrize("text, fast, instructions, expect, sentence", [
    (EPYC_AVX2, False, (), "slower",
     "this CPU has no fast 8-bit instructions (AVX2 without VNNI): INT8 is expected slower than fp32 here"),
    (EPYC_VNNI, True, ("avx512_vnni",), "faster",
     "this CPU has fast 8-bit instructions (AVX512-VNNI): INT8 is expected faster than fp32 here"),
    (SAPPHIRE_RAPIDS, True, ("amx_int8", "avx512_vnni", "avx_vnni"), "faster",
     "this CPU has fast 8-bit instructions (AMX-INT8, AVX512-VNNI, AVX-VNNI): INT8 is expected faster than fp32 here"),
    (ALDER_LAKE, True, ("avx_vnni",), "faster",
     "this CPU has fast 8-bit instructions (AVX-VNNI): INT8 is expected faster than fp32 here"),
    # ARM: the instructions are named, no direction is promised (the lab has measured INT8 on x86 only).
    (NEOVERSE_N1, True, ("asimddp",), "", "this CPU has fast 8-bit instructions (ARM dot product)"),
    (NEOVERSE_V1, True, ("i8mm", "asimddp"), "", "this CPU has fast 8-bit instructions (ARM I8MM, ARM dot product)"),
    (CORTEX_A72, False, (), "", "this CPU has no fast 8-bit instructions (ARM without the 8-bit dot products)"),
])
def test_what_8_bit_compute_a_cpu_has(tmp_path: Path, text: str, fast: bool, instructions: tuple[str, ...],
                                      expect: str, sentence: str) -> None:
    found = cpu_int8(_cpu(tmp_path, text))
    assert (found.known, found.fast_int8, found.instructions, found.expect) == (True, fast, instructions, expect)
    assert found.sentence() == sentence
    # has_vnni keeps its meaning: x86 VNNI only (the INT8 build's S8 weights), not AMX alone, never ARM.
    assert has_vnni(_cpu(tmp_path, text)) == bool({"avx512_vnni", "avx_vnni"} & set(instructions))


@pytest.mark.parametrize("text", ["", "processor\t: 0\nmodel name\t: something\n"])
def test_a_cpuinfo_without_flags_says_nothing_is_known(tmp_path: Path, text: str) -> None:
    path = _cpu(tmp_path, text)
    assert cpu_flags(path) is None and recorded_flags(path) is None and not has_vnni(path)
    found = cpu_int8(path)
    assert (found.known, found.fast_int8, found.expect) == (False, False, "")
    assert found.sentence() == "whether this CPU has fast 8-bit instructions is not known (its flags were not read)"


def test_a_missing_cpuinfo_says_nothing_is_known(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-file"
    assert cpu_flags(missing) is None and not has_vnni(missing)
    assert not cpu_int8(missing).known


def test_a_record_keeps_the_flags_that_say_it_and_says_it_of_the_machine_that_ran(tmp_path: Path) -> None:
    kept = recorded_flags(_cpu(tmp_path, SAPPHIRE_RAPIDS))
    assert kept == ["sse2", "avx2", "avx512f", "f16c", "amx_int8", "avx512_vnni", "avx_vnni"]
    assert set(kept) <= set(CPU_FLAGS)
    assert int8_compute(kept) == cpu_int8(_cpu(tmp_path, SAPPHIRE_RAPIDS))
    for text in (EPYC_AVX2, NEOVERSE_N1, CORTEX_A72):  # the architecture too: sse2 or asimd is kept
        assert int8_compute(recorded_flags(_cpu(tmp_path, text))) == cpu_int8(_cpu(tmp_path, text))
    said = int8_compute(recorded_flags(_cpu(tmp_path, EPYC_AVX2))).sentence("the CPU that ran it", "there")
    assert said == ("the CPU that ran it has no fast 8-bit instructions (AVX2 without VNNI): INT8 is expected "
                    "slower than fp32 there")
    assert not int8_compute(None).known  # a record from before the flags were kept

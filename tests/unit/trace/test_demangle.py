"""C++ names from a real PyTorch 2.11 stack (read on an H200): demangled by libstdc++, and
shortened for one line by ``short_function``."""

from __future__ import annotations

import pytest

from ingero.schema.stacks import Frame, short_function
from ingero.trace.demangle import demangle

COLLECTIVE = (
    "_ZN4c10d16ProcessGroupNCCL10collectiveIZNS0_14allreduce_implERN2at6TensorEPKcRKNS_16Allreduce"
    "OptionsEEUlS4_S4_P8ncclCommRN3c104cuda10CUDAStreamEE_ZNS0_10collectiveISG_EENSC_13intrusive_"
    "ptrINS_4WorkENSC_6detail34intrusive_target_default_null_typeISJ_EEEES4_S4_T_NS_6OpTypeEbS6_bE"
    "UlSF_RNSI_INS0_8WorkNCCLENSL_ISQ_EEEEE_ZNSH_ISG_EESN_S4_S4_SO_SP_bS6_bEUlSF_ST_E0_EESN_RSt6vec"
    "torIS3_SaIS3_EESZ_SO_T0_T1_SP_bS6_b.constprop.0"
)


@pytest.mark.parametrize(
    ("mangled", "demangled", "short"),
    [
        ("_ZNK3c104cuda10CUDAStream11synchronizeEv", "c10::cuda::CUDAStream::synchronize() const",
         "c10::cuda::CUDAStream::synchronize"),
        ("_ZN2at6native12_GLOBAL__N_119addmm_out_cuda_implERNS_6TensorERKS2_S5_S5_RKN3c106ScalarES9_"
         "NS1_10ActivationEb.isra.0", None, "at::native::(anonymous namespace)::addmm_out_cuda_impl"),
        (COLLECTIVE, None, "c10d::ProcessGroupNCCL::collective<…>"),
        ("_ZN2at4cuda4blas13gemm_and_biasIffEEbbblllNS_10OpMathTypeIT_E4typeEPKS4_lS8_lS8_PT0_lNS1_29"
         "GEMMAndBiasActivationEpilogueE", None, "at::cuda::blas::gemm_and_bias<…>"),
        ("_ZN3c1010TensorImplD0Ev.localalias", "c10::TensorImpl::~TensorImpl() [clone .localalias]",
         "c10::TensorImpl::~TensorImpl"),
        ("_ZNSt8functionIFvvEEclEv", "std::function<void ()>::operator()()",
         "std::function<…>::operator()"),
        ("_ZN3foolsERKS_", "foo::operator<<(foo const&)", "foo::operator<<"),
        ("cudaLaunchKernel", "cudaLaunchKernel", "cudaLaunchKernel"),  # C names as they are
        ("_Znot_a_name", "_Znot_a_name", "_Znot_a_name"),  # what does not demangle, as it is
    ],
)  # fmt: skip
def test_demangled_and_shortened(mangled: str, demangled: str | None, short: str) -> None:
    full = demangle(mangled)
    if demangled is not None:
        assert full == demangled
    assert full != mangled or not mangled.startswith("_ZN")
    assert short_function(full) == short
    assert Frame("native", full, lib="/x/libtorch_cuda.so").label() == f"{short} (libtorch_cuda.so)"


def test_a_name_cut_inside_its_template_arguments_still_reads() -> None:
    full = demangle(COLLECTIVE)
    cut = full[: full.index("collective<") + 30]  # as MAX_TEXT cuts a long one
    assert short_function(cut) == "c10d::ProcessGroupNCCL::collective<…>"

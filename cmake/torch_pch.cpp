// The one source of cohort_torch_pch, the target that precompiles <torch/torch.h> for cohort's
// own LibTorch programs (CMakeLists.txt: cohort_use_torch_pch).

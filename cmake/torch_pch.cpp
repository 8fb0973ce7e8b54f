// The one source of cohort_torch_pch, the target that precompiles <torch/torch.h> and
// <nlohmann/json.hpp> for cohort's own LibTorch programs (CMakeLists.txt: cohort_use_torch_pch).

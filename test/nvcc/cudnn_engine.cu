// The cuDNN attention engine of the CUDA backend's bf16 path (include/moonmoe/backend/cuda/cudnn.hpp) as its own
// translation unit: tools/gpu_check.sh prepare compiles it once (cudnn-frontend's headers take about 90 s of nvcc)
// and links it into every GPU binary, where it registers the engine at start-up.
#include <moonmoe/backend/cuda/cudnn.hpp>

// Emulated-device stand-in for <cuda_runtime.h>: everything it would declare comes from pagedlab_emu.h.
#pragma once
#include "pagedlab_emu.h"

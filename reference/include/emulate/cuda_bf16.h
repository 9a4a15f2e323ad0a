// Emulated-device stand-in for <cuda_bf16.h>: everything it would declare comes from pagedlab_emu.h.
#pragma once
#include "pagedlab_emu.h"

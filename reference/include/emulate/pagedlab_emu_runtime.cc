// The engine, compiled once per compiler and engine version (emulate.py caches the object).
#include "pagedlab_emu_runtime.h"

"""Error types shared by the labs, so tests, starters and solutions name the same classes.

Every error names the argument at fault and what was expected; an operation that raises one of
these leaves the object it was called on unchanged.
"""

from __future__ import annotations


class OutOfBlocksError(MemoryError):
    """No free physical block is left for the request (nothing was allocated)."""


class BlockNotAllocatedError(ValueError):
    """The operation needs an allocated block (ref_count > 0), and this block is free."""


class DoubleFreeError(BlockNotAllocatedError):
    """``free`` of a block whose ref_count is already 0."""


# --- Lab 2: the KV-cache pool and its sequences ---------------------------------------------


class UnknownSequenceError(LookupError):
    """No live sequence has this ``seq_id`` (never added, or already freed)."""


class DuplicateSequenceError(ValueError):
    """A live sequence already has this ``seq_id`` (``add_sequence`` or a ``fork`` target)."""


class SequenceTooLongError(ValueError):
    """The sequence would hold more tokens than its block-table row allows (``max_model_len``)."""


class TooManySequencesError(RuntimeError):
    """Every block-table row is taken: ``max_num_seqs`` sequences are already live."""


class DeviceMismatchError(ValueError):
    """A tensor lives on a different device than the object it is handed to."""


# --- Lab 5: the prefill kernels -------------------------------------------------------------


class UnsupportedConfigError(ValueError):
    """The kernel has no code for this size or dtype (head_size, block_size, dtype): a limit of
    the kernel, not a malformed input."""


class ComputeCapabilityError(UnsupportedConfigError):
    """The GPU is too old for this stage: its kernel file uses an instruction that needs a
    newer compute capability (``mma.sync`` m16n8k16, ``ldmatrix``, ``cp.async`` need 8.0; a
    Colab or Kaggle T4 is 7.5). Raised by ``reference.cuda.check_capability`` before compiling.

    Attributes:
        required: the compute capability the stage needs, e.g. ``"8.0"``.
        capability: the device's, e.g. ``"7.5"``.
    """

    def __init__(self, message: str, required: str = "8.0", capability: str = ""):
        super().__init__(message)
        self.required = required
        self.capability = capability


class PlanCaptureError(RuntimeError):
    """A plan (``plan_decode`` / ``plan_prefill``) could not learn a launcher's launches: it
    launched nothing through ``reference.cuda.launch``, or gave its kernels a copy of an input
    instead of the input itself (a plan re-points only the inputs' own pointers)."""


# --- Labs 4 and 5 on the emulated device (reference/emulate.py) ------------------------------


class KernelFaultError(RuntimeError):
    """An emulated kernel stopped on a fault a GPU would not report clearly: the message names
    the kernel, the (block, thread) and what went wrong."""


class KernelOutOfBoundsError(KernelFaultError, IndexError):
    """An emulated kernel read or wrote outside a kernel argument array (or wrote to a const
    input): the message names the kernel, the array, the element index and the (block, thread)."""


class KernelDeadlockError(KernelFaultError):
    """A ``__syncthreads()`` or warp collective that not every thread it waits for reaches:
    the message names the barrier's line and the threads that are missing."""


class KernelTimeoutError(KernelFaultError):
    """An emulated kernel ran past its CPU-time limit (``PAGEDLAB_EMU_TIMEOUT`` seconds, 120 by
    default): most likely an endless loop. It costs the test, never the whole run."""


class KernelRaceError(KernelFaultError):
    """The emulated racecheck (``PAGEDLAB_EMU_RACECHECK=1``) saw two threads touch the same
    shared-memory byte with nothing ordering them, at least one writing: the message names the
    kernel, the ``__shared__`` array and offset, both (block, thread) pairs and source lines."""

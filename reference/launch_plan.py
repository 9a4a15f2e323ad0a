"""Plan once, run many: the shared machinery of Lab 4's ``plan_decode`` and Lab 5's
``plan_prefill`` (given code, not lab content).

A *plan* is made once for a batch shape. It runs the student's own launcher once with its
launches *recorded* instead of run (:func:`record_launches`): the launcher validates, plans,
allocates its scratch and resolves the compiled kernel, the grid, block and dynamic shared
memory, exactly as a one-call launch does, and the plan keeps what it launched. The plan itself
knows nothing of how a lab launches (that is the lab's exercise); it only re-points the
arguments that were the inputs' pointers. Its ``run`` then checks only what may change per call
and costs O(1) attribute reads — shape, dtype, device, contiguity, 16-byte alignment of each
tensor, never a read of device memory — and launches on the current torch stream. That is the
split of FlashInfer's ``BatchDecodeWithPagedKVCacheWrapper.plan`` / ``.run`` and of vLLM's
attention metadata builders (build the metadata once per step, reuse it in every layer).

What this module holds:

* :class:`FrozenPlan`, a base whose instances refuse attribute assignment after construction;
* :class:`TensorSpec` and :func:`check_like`, the per-call check of one tensor against the plan;
* :func:`record_launches` and :func:`replay`, a launcher's launches learnt once and re-run with
  the run's tensors;
* :class:`KernelLaunch`, one kernel launch with everything but its pointer arguments resolved:
  on a GPU it launches on the current torch stream through a cached CuPy stream wrapper; under
  ``PAGEDLAB_DEVICE=emulate`` it runs the emulator instead;
* :func:`with_null_launches`, a copy of a plan whose launches do nothing, for measuring the
  Python host cost of ``run`` on a machine without a GPU.
"""

from __future__ import annotations

import copy
import threading
from dataclasses import dataclass

import numpy as np

from reference import cuda as rcuda
from reference.errors import DeviceMismatchError, PlanCaptureError
from reference.tma import TMAP_BYTES, TensorMap


class FrozenPlan:
    """Base of the plans: attributes are set once, in ``__init__``, through :meth:`_set`.

    NOTE: a plan is shared by every call that runs it (and baked into CUDA graphs captured
    from it), so changing one in place would silently change them all: make a new plan.
    """

    def _set(self, **values) -> None:
        for name, value in values.items():
            object.__setattr__(self, name, value)

    def __setattr__(self, name, value):
        raise AttributeError(f"{type(self).__name__} is immutable (it cannot set {name!r}): a "
                             f"plan is shared by every run and captured graph; make a new plan")

    def __delattr__(self, name):
        raise AttributeError(f"{type(self).__name__} is immutable (it cannot delete {name!r})")


@dataclass(frozen=True)
class TensorSpec:
    """What a plan expects of one tensor argument of ``run``.

    Attributes:
        shape: the exact shape planned.
        dtype: the torch dtype planned.
        device: the torch device planned.
        align: the byte alignment the kernels need of its first element (1: none).
        kind: the tensor type (``torch.Tensor``).
    """

    shape: tuple
    dtype: object
    device: object
    align: int = 1
    kind: type = object


def spec_of(x, align: int = 1) -> TensorSpec:
    """Returns the :class:`TensorSpec` of a (validated) torch tensor."""
    return TensorSpec(tuple(x.shape), x.dtype, x.device, align, type(x))


def check_like(name: str, x, spec: TensorSpec):
    """The per-call check of one ``run`` argument: O(1) attribute reads, no device access.

    Args:
        name: the argument's name, for the message.
        x: what the caller passed (a torch tensor; a CuPy array is viewed as one).
        spec: what the plan was made for.

    Returns:
        ``x`` as a torch tensor.

    Raises:
        TypeError: not a tensor, or another dtype than planned.
        ValueError: another shape than planned, not contiguous, or misaligned.
        DeviceMismatchError: on another device than planned.
    """
    # NOTE: one short-circuiting test on the path every run takes; the messages are built
    # only when something is wrong.
    if (type(x) is spec.kind and x.shape == spec.shape and x.dtype == spec.dtype
            and x.device == spec.device and x.is_contiguous() and not x.data_ptr() % spec.align):
        return x
    return _explain(name, x, spec)


def _explain(name: str, x, spec: TensorSpec):
    """The slow path of :func:`check_like`: a CuPy array, a subclass, or the typed error."""
    if not isinstance(x, spec.kind):
        if not rcuda.is_cupy(x):
            raise TypeError(f"{name} must be a torch tensor or a CuPy array, got "
                            f"{type(x).__name__}")
        x = rcuda.as_torch(x)
    if x.shape != spec.shape:
        raise ValueError(f"{name} has shape {tuple(x.shape)} but the plan was made for "
                         f"{spec.shape}: a new batch shape needs a new plan")
    if x.dtype != spec.dtype:
        raise TypeError(f"{name} has dtype {x.dtype} but the plan was made for {spec.dtype}")
    if x.device != spec.device:
        raise DeviceMismatchError(f"{name} is on {x.device} but the plan was made for "
                                  f"{spec.device}")
    if not x.is_contiguous():
        raise ValueError(f"{name} must be contiguous (the kernels index it densely)")
    if x.data_ptr() % spec.align:
        raise ValueError(f"{name} must start on a {spec.align}-byte boundary (the kernels load "
                         f"16 bytes at a time); it is a view with an odd offset")
    return x


#: torch's C getters of the current device index and of its current raw stream handle, set when
#: the first launch is packed (torch is imported lazily here). NOTE: the C function, not
#: ``torch.cuda.current_device``, whose Python wrapper re-checks lazy initialisation on every
#: call: a plan exists only after CUDA was initialised.
_CURRENT_DEVICE = _RAW_STREAM = None

#: CuPy wrappers of torch streams, by raw stream handle (one wrapper per stream, made once).
_CUPY_STREAMS: dict[int, object] = {}


def _cupy_stream(torch_stream):
    """Returns the cached CuPy wrapper of a torch stream (made on first use)."""
    handle = torch_stream.cuda_stream
    wrapped = _CUPY_STREAMS.get(handle)
    if wrapped is None:
        import cupy

        wrapped = _CUPY_STREAMS[handle] = cupy.cuda.ExternalStream(handle)
    return wrapped


class KernelLaunch(FrozenPlan):
    """One kernel launch resolved at plan time: the compiled kernel, grid, block and dynamic
    shared memory, and the device. Calling it with the argument tuple launches on the current
    torch stream of the plan's device (the emulator runs it under ``PAGEDLAB_DEVICE=emulate``);
    :meth:`launch_with` re-launches its recorded argument tuple with new pointers.

    On a GPU, given its argument ``template`` at plan time, it packs the arguments once into a
    parameter block (one 8-byte slot per argument, 128 bytes of its own for a TMA tensor map;
    the array of slot addresses CUDA's ``cuLaunchKernel`` takes) and :meth:`launch_with` only
    rewrites the pointer slots (and the maps made from inputs) and calls the driver on torch's
    current raw stream: no per-call argument conversion, stream object or device context. That
    is the host cost FlashInfer's ``run`` has.

    Attributes:
        kernel: the ``cupy.RawKernel`` (or the emulator's kernel).
        grid: grid dimensions.
        block: block dimensions.
        shared_mem: dynamic shared memory in bytes.
        device: the torch device it launches on.
    """

    __slots__ = ("kernel", "grid", "block", "shared_mem", "device", "_emulated", "_cupy_device",
                 "_packed", "_lock", "_index")

    def __init__(self, kernel, grid, block, shared_mem: int, device, template: tuple | None = None):
        emulated = type(kernel).__name__ == "EmulatedKernel"
        cupy_device = packed = None
        if not emulated:
            import cupy

            cupy_device = cupy.cuda.Device(device.index or 0)
            # NOTE: raising the dynamic shared-memory limit is a driver call: once, here.
            rcuda.raise_shared_mem_limit(kernel, shared_mem)
            if template is not None:
                with cupy_device:
                    packed = _pack(kernel, tuple(grid), tuple(block), int(shared_mem), template,
                                   device.index or 0)
        self._set(kernel=kernel, grid=tuple(grid), block=tuple(block), shared_mem=int(shared_mem),
                  device=device, _emulated=emulated, _cupy_device=cupy_device, _packed=packed,
                  _lock=threading.Lock(), _index=device.index or 0)

    def __call__(self, args: tuple) -> None:
        """Launches with ``args`` (pointers from :meth:`ptr`, NumPy scalars)."""
        if self._emulated:
            from reference import emulate

            emulate.launch(self.kernel, self.grid, self.block, args, self.shared_mem)
            return
        import torch

        with self._cupy_device, _cupy_stream(torch.cuda.current_stream(self.device)):
            self.kernel(self.grid, self.block, rcuda.kernel_args(args), shared_mem=self.shared_mem)

    def launch_with(self, template: tuple, slots: tuple, ptrs, stream: int | None = None) -> None:
        """Launches ``template`` with ``ptrs[i]`` at each ``(position, i)`` of ``slots``.

        Args:
            template: the recorded argument tuple (the one given at construction, if any).
            slots: ``(position, input index)`` pairs to overwrite.
            ptrs: the run's pointers, by input index.
            stream: torch's current raw stream on the plan's device, from :meth:`raw_stream`
                (None: looked up here); a run with several launches looks it up once.
        """
        packed = self._packed
        if packed is not None:
            if stream is None:
                stream = self.raw_stream()
            if stream is not None:
                vals, launch = packed
                maps = launch.maps
                # NOTE: the parameter block is shared by every run of the plan; the driver
                # copies it at launch, so holding the lock from the writes to the launch is
                # enough.
                with self._lock:
                    for pos, i in slots:
                        if pos in maps:  # a tensor map: re-encoded for the run's address
                            maps[pos][:] = _map_bytes(template[pos].at(ptrs[i]))
                        else:
                            vals[pos] = ptrs[i]
                    if launch(stream):
                        return
        args = list(template)
        for pos, i in slots:
            p = ptrs[i]
            # NOTE: a run's GPU pointers are plain ints (see _address): CuPy would pass an int
            # as a signed 64-bit value, so the fallback gives the kernel the np.uint64 it was
            # planned with.
            args[pos] = (args[pos].at(p) if isinstance(args[pos], TensorMap)
                         else np.uint64(p) if isinstance(p, int) else p)
        self(tuple(args))

    def raw_stream(self) -> int | None:
        """torch's current raw CUDA stream for this launch's fast path, or None when it has
        none (emulated, arguments the parameter block cannot hold, no raw-stream getter in this
        torch) or another device is current (CuPy's path then sets the device)."""
        if self._packed is None or _RAW_STREAM is None or _CURRENT_DEVICE() != self._index:
            return None
        return _RAW_STREAM(self._index)

    @property
    def emulated(self) -> bool:
        """True when it runs on the emulated device."""
        return self._emulated


def _pack(kernel, grid: tuple, block: tuple, shared_mem: int, template: tuple, index: int):
    """Packs ``template`` into a ``cuLaunchKernel`` parameter block.

    Returns:
        ``(slots, launch)``: the uint64 array of argument slots (pointer slots are rewritten by
        each run) and a function launching with it on a raw stream handle
        (:meth:`KernelLaunch.raw_stream`), which returns False when the driver refuses (the
        caller then takes CuPy's path); or None when an argument has a type the block does not
        hold.
    """
    import torch
    from cupy.cuda import driver

    vals = np.zeros(max(len(template), 1), dtype=np.uint64)
    as_i32, as_f32 = vals.view(np.int32), vals.view(np.float32)
    # A tensor map (128 bytes, by value) gets its own 64-byte aligned buffer; its argument
    # pointer points there instead of at its 8-byte slot.
    maps, map_store = {}, []
    for pos, arg in enumerate(template):
        if isinstance(arg, TensorMap):
            raw = np.zeros(TMAP_BYTES + 64, dtype=np.uint8)
            start = -raw.ctypes.data % 64
            maps[pos] = raw[start:start + TMAP_BYTES]
            maps[pos][:] = _map_bytes(arg.value)
            map_store.append(raw)
        elif arg is None or isinstance(arg, (np.uint64, np.int64)):
            vals[pos] = 0 if arg is None else arg  # a pointer slot, or a 64-bit integer
        elif isinstance(arg, np.int32):
            as_i32[2 * pos] = arg  # little-endian: the low half of the slot is the int
        elif isinstance(arg, np.float32):
            as_f32[2 * pos] = arg
        else:
            return None
    argv = np.array([maps[pos].ctypes.data if pos in maps else vals.ctypes.data + 8 * pos
                     for pos in range(len(vals))], dtype=np.uint64)
    fn_ptr = kernel.kernel.ptr
    gx, gy, gz = (*grid, 1, 1)[:3]
    bx, by, bz = (*block, 1, 1)[:3]
    argv_ptr = argv.ctypes.data
    global _CURRENT_DEVICE, _RAW_STREAM
    _RAW_STREAM = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    _CURRENT_DEVICE = getattr(torch._C, "_cuda_getDevice", torch.cuda.current_device)

    def launch(stream: int) -> bool:
        try:
            driver.launchKernel(fn_ptr, gx, gy, gz, bx, by, bz, shared_mem, stream, argv_ptr, 0)
        except driver.CUDADriverError:
            return False  # e.g. no context current on this thread yet: CuPy's path sets one
        return True

    launch.keep = (vals, argv, map_store)  # the block must outlive every launch made with it
    launch.maps = maps
    return vals, launch


def _map_bytes(value: np.void) -> np.ndarray:
    """An encoded tensor map's 128 bytes, to copy into its parameter buffer."""
    return np.frombuffer(value.tobytes(), np.uint8)


def _arg_address(arg) -> int | None:
    """The address a recorded pointer argument holds (None for a scalar)."""
    if isinstance(arg, np.uint64):
        return int(arg)
    if isinstance(arg, TensorMap):  # made from an input: re-encoded for each run's address
        return arg.address
    if type(arg).__name__ == "HostArray":  # the emulator's fenced CPU array
        return arg.address
    return None


def _distinct(tensors: tuple) -> tuple:
    """``tensors`` with every one that shares its first byte with an earlier one cloned.

    NOTE: a plan tells the inputs apart by address, so two inputs that are the same memory
    (a benchmark passing one cache as keys and values) would be ambiguous: the later one is
    recorded on a copy, which costs memory only in that unusual case.
    """
    seen, result = set(), []
    for x in tensors:
        if x is not None and x.numel():
            if x.data_ptr() in seen:
                x = x.clone()
            seen.add(x.data_ptr())
        result.append(x)
    return tuple(result)


def record_launches(who: str, launcher, names: tuple, tensors: tuple, required: tuple, device):
    """Runs ``launcher`` once with its launches recorded, and returns what a run re-plays.

    Args:
        who: the plan and the launcher, for messages (``"plan_decode (_split_kv_launch)"``).
        launcher: called as ``launcher(*tensors)``; it validates, plans and launches through
            ``reference.cuda.launch`` as a one-call launch does (nothing runs on the device).
        names: a name per input tensor, for messages.
        tensors: the inputs (torch tensors or None), in the order a run passes their pointers to
            :func:`replay`; inputs that share memory are told apart by copying the later one.
        required: the names of inputs every kernel launch set must read (a launcher that gives
            its kernels a copy of one would make a plan whose runs read stale data).
        device: the torch device the launches run on.

    Returns:
        ``(result, launches, templates, kept)``: the launcher's return value; a
        :class:`KernelLaunch` per recorded launch; per launch its argument tuple and the
        ``(position, input index)`` pairs a run overwrites; the scratch the launcher allocated
        (keep it as long as the launches).

    Raises:
        PlanCaptureError: the launcher launched nothing, or no launch read a required input.
    """
    tensors = _distinct(tensors)
    index = {x.data_ptr(): i for i, x in enumerate(tensors) if x is not None and x.numel()}
    with rcuda.capture_launches() as (recorded, kept):
        result = launcher(*tensors)
    launches, templates, read = [], [], set()
    for r in recorded:
        slots = tuple((pos, index[a]) for pos, a in
                      ((pos, _arg_address(arg)) for pos, arg in enumerate(r.args))
                      if a is not None and a in index)
        read.update(i for _, i in slots)
        # The inputs' own pointers are overwritten by every run: keep no reference to them.
        args = list(r.args)
        for pos, _ in slots:
            if not isinstance(args[pos], TensorMap):  # a map keeps only an address
                args[pos] = None
        launches.append(KernelLaunch(r.kernel, r.grid, r.block, r.shared_mem, device,
                                     template=tuple(args)))
        templates.append((tuple(args), slots))
    if recorded:
        missing = [n for i, n in enumerate(names) if n in required and i in index.values()
                   and i not in read]
        if missing:
            raise PlanCaptureError(
                f"{who} launched kernels that read none of {missing} itself: a plan re-points "
                f"the inputs' own pointers, so the launcher must pass ptr(<the input>) (a copy "
                f"would leave every run reading the copy made at plan time)")
    kept = tuple(x for x in kept if x is None or all(x is not t for t in tensors))
    return result, tuple(launches), tuple(templates), kept


def replay(launches: tuple, templates: tuple, ptrs: tuple) -> None:
    """Launches recorded launches with the run's pointers.

    Args:
        launches: the :class:`KernelLaunch` per launch (:func:`record_launches`).
        templates: per launch, its argument tuple and the positions of the inputs' pointers.
        ptrs: the run's pointers, one per input, in the order the plan recorded them.
    """
    # NOTE: the launches of one plan share its device, so torch's current stream is looked up
    # once per run, not per launch. On the H200 hosts (2026-11-29) the lookup cost 0.34 µs
    # through torch.cuda.current_device and 0.20 µs through the C getters; a driver launch
    # costs 4.8-6.2 µs there, so the lookup is a small part of a run.
    stream = launches[0].raw_stream() if launches else None
    for launch, (template, slots) in zip(launches, templates):
        launch.launch_with(template, slots, ptrs, stream)


def no_launcher_launch(who: str) -> PlanCaptureError:
    """The error for a launcher that launched nothing where it had work to do."""
    return PlanCaptureError(
        f"{who} launched no kernel through reference.cuda.launch for a batch with work to do: "
        f"launch with launch(...) (reference.cuda) so that a plan can record it")


def ptr_function(device):
    """Returns the pointer conversion ``run`` uses for tensors on ``device``: a raw address on a
    GPU, the emulator's fenced host array for CPU tensors under emulation."""
    if device.type == "cpu":
        return rcuda.ptr
    return _address


def _address(x) -> int:
    """A GPU tensor's address as a plain int.

    NOTE: an int, not ``np.uint64``: building a NumPy scalar cost 0.4 µs per tensor on the
    H200 machines' host (2026-11-29), six of them per decode run; without them ``run``'s Python
    fell from 6.1 to 4.4 µs here (``pagedlab bench host_cost``). The packed parameter block
    stores an int as it is, and the slow path converts it (:meth:`KernelLaunch.launch_with`).
    """
    return x.data_ptr()


class _NullLaunch:
    """A launch that does nothing (host-cost measurement without a GPU)."""

    __slots__ = ("calls",)

    def __init__(self):
        self.calls = 0

    def __call__(self, args: tuple) -> None:
        self.calls += 1

    def raw_stream(self) -> None:
        return None

    def launch_with(self, template: tuple, slots: tuple, ptrs, stream=None) -> None:
        args = list(template)
        for pos, i in slots:
            args[pos] = ptrs[i]
        self(tuple(args))


def with_null_launches(plan):
    """Returns a copy of ``plan`` whose kernel launches do nothing and whose pointers are raw
    addresses, as on a GPU: timing its ``run`` measures the Python host cost of the checks and
    the argument packing, everything but CuPy's launch itself. For CPU-only measurements.

    Args:
        plan: a plan with ``_launches`` (a tuple of launches) and ``_ptr``.

    Returns:
        The copy (the original is unchanged).
    """
    clone = copy.copy(plan)
    object.__setattr__(clone, "_launches", tuple(_NullLaunch() for _ in plan._launches))
    object.__setattr__(clone, "_ptr", _address)
    return clone

"""The double's builder: `Builder` and `IBuilderConfig` (TensorRT 10: no ``build_engine``, no
``max_workspace_size``; ``build_serialized_network`` returns None and logs why on failure)."""

from __future__ import annotations

from typing import Any

from . import (
    BuilderFlag,
    IHostMemory,
    IInt8Calibrator,
    ILogger,
    INetworkDefinition,
    IOptimizationProfile,
    IProgressMonitor,
    ITimingCache,
    LayerType,
    MemoryPoolType,
    _double,
    _Strict,
)

_EXPLICIT_BATCH = 1 << 0


class IBuilderConfig(_Strict):
    __slots__ = ("_flags", "_pools", "_profiles", "_timing_cache", "int8_calibrator", "progress_monitor")

    def __init__(self) -> None:
        self._flags: set[BuilderFlag] = set()
        self._pools: dict[MemoryPoolType, int] = {}
        self._profiles: list[IOptimizationProfile] = []
        self._timing_cache: ITimingCache | None = None
        self.int8_calibrator: IInt8Calibrator | None = None
        self.progress_monitor: IProgressMonitor | None = None

    def set_memory_pool_limit(self, pool: MemoryPoolType, pool_size: int) -> None:
        if not isinstance(pool, MemoryPoolType) or pool_size < 0:
            raise TypeError(f"set_memory_pool_limit({pool!r}, {pool_size!r})")
        self._pools[pool] = pool_size

    def get_memory_pool_limit(self, pool: MemoryPoolType) -> int:
        return self._pools.get(pool, 8 << 30)

    def set_flag(self, flag: BuilderFlag) -> None:
        self._flags.add(flag)

    def get_flag(self, flag: BuilderFlag) -> bool:
        return flag in self._flags

    def clear_flag(self, flag: BuilderFlag) -> None:
        self._flags.discard(flag)

    def add_optimization_profile(self, profile: IOptimizationProfile) -> int:
        self._profiles.append(profile)
        return len(self._profiles) - 1

    def create_timing_cache(self, serialized_timing_cache: bytes) -> ITimingCache:
        import json

        data = bytes(serialized_timing_cache)
        return ITimingCache(json.loads(data) if data else [])

    def set_timing_cache(self, cache: ITimingCache, ignore_mismatch: bool) -> bool:
        self._timing_cache = cache
        return True

    def get_timing_cache(self) -> ITimingCache:
        if self._timing_cache is None:
            raise RuntimeError("no timing cache set")
        return self._timing_cache


class Builder(_Strict):
    __slots__ = ("_logger",)

    def __init__(self, logger: ILogger) -> None:
        if not isinstance(logger, ILogger):
            raise TypeError("Builder needs an ILogger")
        self._logger = logger

    @property
    def platform_has_fast_fp16(self) -> bool:
        return _double.GPU.fast_fp16

    @property
    def platform_has_fast_int8(self) -> bool:
        return _double.GPU.fast_int8

    def create_network(self, flags: int = 0) -> INetworkDefinition:
        if flags & ~_EXPLICIT_BATCH:
            raise ValueError(f"unsupported network flags {flags}")
        return INetworkDefinition()

    def create_builder_config(self) -> IBuilderConfig:
        return IBuilderConfig()

    def create_optimization_profile(self) -> IOptimizationProfile:
        return IOptimizationProfile()

    def _error(self, message: str) -> None:
        self._logger.log(ILogger.Severity.ERROR, message)

    def build_serialized_network(self, network: INetworkDefinition, config: IBuilderConfig) -> IHostMemory | None:
        if not network.onnx:
            self._error("Network must have at least one output")
            return None
        inputs = [network.get_input(i) for i in range(network.num_inputs)]
        dynamic = [t for t in inputs if -1 in list(t.shape)]
        profile = config._profiles[0].shapes if config._profiles else {}
        for tensor in dynamic:
            if tensor.name not in profile:
                self._error(f"Network has dynamic or shape inputs, but no optimization profile ({tensor.name}).")
                return None
            for bound in profile[tensor.name]:
                if len(bound) != len(tensor.shape) or any(
                    d not in (-1, b) for d, b in zip(tensor.shape, bound, strict=True)
                ):
                    self._error(f"{tensor.name}: profile dimensions {bound} do not match {list(tensor.shape)}")
                    return None
        qdq = any(
            network.get_layer(i).type in (LayerType.QUANTIZE, LayerType.DEQUANTIZE) for i in range(network.num_layers)
        )
        precision = "fp32"
        if BuilderFlag.FP16 in config._flags:
            precision = "fp16"
        calibrated = False
        if BuilderFlag.INT8 in config._flags:
            precision = "int8"
            if not qdq:
                if config.int8_calibrator is None:
                    self._logger.log(ILogger.Severity.WARNING, "INT8 without calibrator or Q/DQ: missing scales")
                else:
                    if not self._calibrate(config.int8_calibrator, [t.name for t in inputs]):
                        return None
                    calibrated = True
        if _double.build_gate is not None and not _double.build_gate.wait(60):
            self._error("test double: build_gate was never opened")
            return None
        monitor = config.progress_monitor
        steps = ["parse", "optimize", "tactics", "serialize"]
        if monitor is not None:
            monitor.phase_start("Building engine", None, len(steps))
            for step, _ in enumerate(steps):
                monitor.phase_start("Tactic selection", "Building engine", 2)
                ok = monitor.step_complete("Tactic selection", 0) and monitor.step_complete("Tactic selection", 1)
                monitor.phase_finish("Tactic selection")
                if not (ok and monitor.step_complete("Building engine", step)):
                    monitor.phase_finish("Building engine")
                    self._error("Build was cancelled by the progress monitor.")
                    return None
            monitor.phase_finish("Building engine")
        if config._timing_cache is not None:
            entry = f"{_double.GPU.name}:{precision}:{len(network.onnx)}"
            if entry not in config._timing_cache.entries:
                config._timing_cache.entries.append(entry)
        tensors: list[dict[str, Any]] = [
            {"name": t.name, "mode": "INPUT", "shape": list(t.shape), "dtype": t.dtype.name} for t in inputs
        ]
        tensors += [
            {"name": t.name, "mode": "OUTPUT", "shape": list(t.shape), "dtype": t.dtype.name}
            for t in (network.get_output(i) for i in range(network.num_outputs))
        ]
        _double.builds.append(
            {
                "flags": sorted(f.name for f in config._flags),
                "workspace": config._pools.get(MemoryPoolType.WORKSPACE),
                "profile": profile,
                "calibrated": calibrated,
                "timing_cache": config._timing_cache is not None,
            }
        )
        image = _double.EngineImage(
            onnx=network.onnx,
            precision=precision,
            profile={name: shapes for name, shapes in profile.items()},
            tensors=tensors,
            gpu=_double.GPU.name,
            compute_capability=list(_double.GPU.compute_capability),
            calibrated=calibrated,
        )
        return IHostMemory(image.serialize())

    def _calibrate(self, calibrator: IInt8Calibrator, names: list[str]) -> bool:
        if calibrator.get_batch_size() < 1:
            self._error("calibrator batch size must be positive")
            return False
        cache = calibrator.read_calibration_cache()
        if cache:
            return True
        batches = 0
        while True:
            pointers = calibrator.get_batch(names)
            if not pointers:
                break
            if len(pointers) != len(names) or not all(isinstance(p, int) and p > 0 for p in pointers):
                self._error(f"calibrator returned {pointers!r} for inputs {names}")
                return False
            batches += 1
        if batches == 0:
            self._error("Calibration failure: no batches")
            return False
        calibrator.write_calibration_cache(IHostMemory(f"calibrated on {batches} batches".encode()))
        return True

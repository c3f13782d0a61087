"""OneDeviceStrategy: one replica on one named device."""

from typing import Any

from mpidist.backend import num_gpus
from mpidist.core.devices import DeviceSpec, parse_device
from mpidist.strategies.single_replica import SingleReplicaExtended
from mpidist.strategies.strategy import Strategy
from mpidist.values.variables import Variable

__all__ = ["OneDeviceStrategy", "OneDeviceExtended"]


class OneDeviceStrategy(Strategy):
    """Runs everything on ``device`` (e.g. ``"/gpu:0"`` or ``"/cpu:0"``) with one replica.

    Variables created in its scope are plain Variables placed on the device.
    """

    def __init__(self, device: str | DeviceSpec) -> None:
        spec = parse_device(device)
        if spec.is_gpu and spec.device_index >= num_gpus():
            raise ValueError(
                f"OneDeviceStrategy got {device!r} but this process sees {num_gpus()} GPU(s); "
                "check CUDA_VISIBLE_DEVICES or pass an existing device such as '/cpu:0'."
            )
        super().__init__(OneDeviceExtended(self, spec))
        self._device_arg = device

    def __deepcopy__(self, memo: dict[int, Any]) -> "OneDeviceStrategy":
        return OneDeviceStrategy(self._device_arg)


class OneDeviceExtended(SingleReplicaExtended):
    """One replica on one named device; its variables are plain Variables placed there."""

    _device: DeviceSpec

    def __init__(self, container_strategy: Strategy, device: DeviceSpec) -> None:
        super().__init__(container_strategy, devices=(device,))
        self._device = device

    def create_variable(self, *args: Any, **kwargs: Any) -> Variable:
        """A plain Variable on this strategy's device, belonging to it."""
        kwargs["device"] = self._device
        return Variable.plain(*args, distribute_strategy=self._container_strategy(), **kwargs)

    def _host_device(self) -> DeviceSpec:
        return self._device if self._device.is_cpu else super()._host_device()

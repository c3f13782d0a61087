"""Device strings: parse_device / canonical_device / DeviceSpec, and MirroredStrategy's check of
its device list (DESIGN.md §1 device names; spec §5.7 canonical worker_devices)."""

import re

import pytest

import mpidist
from mpidist.backend import num_gpus
from mpidist.core.devices import DeviceSpec, canonical_device, parse_device

LOCAL = "/job:localhost/replica:0/task:0/device:"


# --------------------------------------------------------------------------------------------
# parse_device / canonical_device
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize(
    "text, device_type, index, job, task, canonical",
    [
        ("/cpu:0", "CPU", 0, "localhost", 0, LOCAL + "CPU:0"),
        ("/gpu:1", "GPU", 1, "localhost", 0, LOCAL + "GPU:1"),
        ("CPU:0", "CPU", 0, "localhost", 0, LOCAL + "CPU:0"),
        ("/device:GPU:0", "GPU", 0, "localhost", 0, LOCAL + "GPU:0"),
        ("/cpu:3", "CPU", 3, "localhost", 0, LOCAL + "CPU:3"),
        ("/job:worker/replica:0/task:1/device:GPU:0", "GPU", 0, "worker", 1,
         "/job:worker/replica:0/task:1/device:GPU:0"),
        ("/job:localhost/replica:0/task:0/device:CPU:2", "CPU", 2, "localhost", 0, LOCAL + "CPU:2"),
    ],
)
def test_parse_device_accepted_forms(text, device_type, index, job, task, canonical):
    """Every TF device form parses to (type, index, job, task) and one canonical full name."""
    spec = parse_device(text)
    assert isinstance(spec, DeviceSpec)
    assert spec.device_type == device_type
    assert spec.device_index == index
    assert spec.job == job
    assert spec.replica == 0
    assert spec.task == task
    assert spec.to_string() == canonical
    assert str(spec) == canonical
    assert canonical_device(text) == canonical


@pytest.mark.parametrize(
    "variant, canonical",
    [
        ("/CPU:0", LOCAL + "CPU:0"),
        ("/Cpu:0", LOCAL + "CPU:0"),
        ("cpu:0", LOCAL + "CPU:0"),
        ("/GPU:1", LOCAL + "GPU:1"),
        ("/device:gpu:0", LOCAL + "GPU:0"),
        ("/DEVICE:GPU:0", LOCAL + "GPU:0"),
        ("/job:worker/replica:0/task:1/device:gpu:0", "/job:worker/replica:0/task:1/device:GPU:0"),
        ("/JOB:worker/REPLICA:0/TASK:1/DEVICE:GPU:0", "/job:worker/replica:0/task:1/device:GPU:0"),
    ],
)
def test_parse_device_is_case_insensitive(variant, canonical):
    """Device types and part names are matched case-insensitively; the canonical form is upper-case."""
    assert canonical_device(variant) == canonical


def test_equivalent_forms_give_equal_specs():
    """'/cpu:0', 'CPU:0', '/device:CPU:0' and the full name are the same device (equal, same hash)."""
    forms = ["/cpu:0", "CPU:0", "/device:CPU:0", LOCAL + "CPU:0", "/CPU:0"]
    specs = [parse_device(f) for f in forms]
    assert all(s == specs[0] for s in specs)
    assert len(set(specs)) == 1
    assert parse_device("/cpu:0") != parse_device("/cpu:1")
    assert parse_device("/cpu:0") != parse_device("/gpu:0")
    assert parse_device("/job:worker/task:1/device:CPU:0") != parse_device("/cpu:0")


def test_parse_device_returns_devicespec_unchanged():
    """A DeviceSpec given to parse_device is returned as is."""
    spec = DeviceSpec("GPU", 3)
    assert parse_device(spec) is spec
    assert canonical_device(spec) == LOCAL + "GPU:3"


def test_devicespec_defaults_and_kind():
    """DeviceSpec(type, index) defaults to job localhost, replica 0, task 0; is_cpu / is_gpu."""
    cpu = DeviceSpec("CPU", 1)
    gpu = DeviceSpec("GPU", 0)
    assert (cpu.job, cpu.replica, cpu.task) == ("localhost", 0, 0)
    assert cpu.is_cpu and not cpu.is_gpu
    assert gpu.is_gpu and not gpu.is_cpu
    assert str(cpu) == LOCAL + "CPU:1"


def test_devicespec_is_immutable():
    """DeviceSpec is frozen: fields cannot be reassigned."""
    spec = parse_device("/cpu:0")
    with pytest.raises(AttributeError):
        spec.device_index = 1
    assert spec.device_index == 0


@pytest.mark.parametrize(
    "bad",
    [
        "/tpu:0",
        "/xpu:1",
        "banana",
        "/cpu:x",
        "/cpu:-1",
        "/device:FOO:0",
        "/job:worker/replica:zero/device:CPU:0",
        "/job:worker/task:abc/device:CPU:0",
        "/job:worker/replica:0/task:1",
        "/cpu:*",
    ],
)
def test_parse_device_bad_string_value_error_names_it(bad):
    """A malformed device string raises ValueError whose message names the string."""
    with pytest.raises(ValueError, match=re.escape(bad)):
        parse_device(bad)
    with pytest.raises(ValueError, match=re.escape(bad)):
        canonical_device(bad)


@pytest.mark.parametrize("empty", ["", "   "])
def test_parse_device_empty_string_value_error(empty):
    """An empty device string raises ValueError saying it is empty."""
    with pytest.raises(ValueError, match="empty"):
        parse_device(empty)


# --------------------------------------------------------------------------------------------
# MirroredStrategy device list
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_mirrored_worker_devices_canonical(n):
    """MirroredStrategy(['/cpu:0', ...]) has one replica per device, named canonically (§5.7)."""
    s = mpidist.MirroredStrategy([f"/cpu:{i}" for i in range(n)])
    assert s.extended.worker_devices == tuple(LOCAL + f"CPU:{i}" for i in range(n))
    assert s.num_replicas_in_sync == n


def test_mirrored_mixed_forms_are_canonicalised_in_order():
    """Devices given in different spellings keep their order and come back canonical."""
    s = mpidist.MirroredStrategy(["CPU:2", "/device:cpu:0", LOCAL + "CPU:1"])
    assert s.extended.worker_devices == (LOCAL + "CPU:2", LOCAL + "CPU:0", LOCAL + "CPU:1")
    assert s.num_replicas_in_sync == 3


@pytest.mark.parametrize(
    "devices",
    [
        ["/cpu:0", "/cpu:0"],
        ["/cpu:0", "/cpu:1", "/cpu:0"],
        ["/cpu:0", "/device:CPU:0"],
        ["/cpu:1", LOCAL + "CPU:1"],
        ["/cpu:0", "cpu:0"],
    ],
)
def test_mirrored_duplicate_devices_value_error(devices):
    """The same device twice (in any spelling) is a ValueError naming the duplicate."""
    with pytest.raises(ValueError, match=r"(?i)twice|duplicate"):
        mpidist.MirroredStrategy(devices)
    with pytest.raises(ValueError, match=r"(?i)cpu:\d"):
        mpidist.MirroredStrategy(devices)


@pytest.mark.parametrize("devices", [[], ()])
def test_mirrored_empty_device_list_value_error(devices):
    """An empty device list is a ValueError (a strategy needs at least one device)."""
    with pytest.raises(ValueError, match=r"(?i)device"):
        mpidist.MirroredStrategy(devices)


def test_mirrored_bad_device_string_value_error():
    """A malformed device string in the list raises ValueError naming it."""
    with pytest.raises(ValueError, match=re.escape("/tpu:0")):
        mpidist.MirroredStrategy(["/cpu:0", "/tpu:0"])


def test_mirrored_gpu_device_without_gpu_value_error():
    """A GPU index this machine does not have (every GPU on a GPU-less machine) is a ValueError."""
    missing = num_gpus()  # first index that does not exist
    with pytest.raises(ValueError, match=r"(?i)gpu"):
        mpidist.MirroredStrategy([f"/gpu:{missing}"])
    with pytest.raises(ValueError, match=r"(?i)gpu"):
        mpidist.MirroredStrategy(["/cpu:0", f"/gpu:{missing + 1}"])


def test_mirrored_default_devices():
    """MirroredStrategy() uses all visible GPUs, else the single device '/cpu:0' (canonical)."""
    s = mpidist.MirroredStrategy()
    gpus = num_gpus()
    if gpus == 0:
        expected = (LOCAL + "CPU:0",)
    else:
        expected = tuple(LOCAL + f"GPU:{i}" for i in range(gpus))
    assert s.extended.worker_devices == expected
    assert s.num_replicas_in_sync == len(expected)


def test_one_device_strategy_bad_device_value_error():
    """OneDeviceStrategy with a malformed device string raises ValueError naming it."""
    with pytest.raises(ValueError, match=re.escape("/qpu:0")):
        mpidist.OneDeviceStrategy("/qpu:0")

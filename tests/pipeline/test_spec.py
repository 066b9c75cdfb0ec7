"""Profile and cluster JSON: round trips, defaults, and errors that name the field and the fix."""

from __future__ import annotations

import json

import pytest

from pipeline.errors import ClusterError, ProfileError
from pipeline.spec import DEFAULT_MEMORY_RESERVE_GB, Cluster, ModelProfile
from tests.conftest import ROOT

GOOD_LAYER = {"name": "l0", "kind": "attention", "f": 1.0, "b": 1.0, "w": 1.0, "params": 10, "act_bytes": 100,
              "out_bytes": 10}


def test_example_configs_load() -> None:
    for path in (ROOT / "experiments/configs/profiles").glob("*.json"):
        assert ModelProfile.load(path).num_layers > 0
    for path in (ROOT / "experiments/configs/clusters").glob("*.json"):
        assert Cluster.load(path).devices > 0


def test_profile_round_trip_keeps_extra_fields(tmp_path) -> None:
    raw = {"name": "m", "time_unit": "ms", "seq_len": 2048, "microbatch_size": 2, "source": "measured",
           "layers": [dict(GOOD_LAYER, flops_f=123.0),
                      dict(GOOD_LAYER, name="l1", w_graph_bytes=3 * GOOD_LAYER["act_bytes"])]}
    prof = ModelProfile.from_dict(raw)
    assert prof.layers[0].extra == {"flops_f": 123.0}
    # PyTorch's I may keep more than F saved (the gradients W needs); absent, the graph: act_bytes
    assert prof.layers[1].w_graph == 3 * GOOD_LAYER["act_bytes"] and prof.layers[0].w_graph == GOOD_LAYER["act_bytes"]
    path = tmp_path / "p.json"
    prof.save(path)
    again = ModelProfile.load(path)
    assert again == prof and again.extra == {"source": "measured"}
    assert again.tokens_per_microbatch == 4096


@pytest.mark.parametrize("layer_patch,needle", [
    ({"f": -1}, r"field 'f': must be a number >= 0 \(finite\)"),
    ({"f": "fast"}, "field 'f': expected a number"),
    ({"params": 1.5}, "field 'params': must be a whole number"),
    ({"w_act_bytes": 1000}, "exceeds act_bytes"),
    ({"w_graph_bytes": -1}, r"field 'w_graph_bytes': must be a number >= 0"),
    ({"w_graph_bytes": 1.5}, "field 'w_graph_bytes': must be a whole number"),
    ({"name": ""}, "field 'name'"),
])
def test_bad_layer_names_field(layer_patch, needle) -> None:
    with pytest.raises(ProfileError, match=needle):
        ModelProfile.from_dict({"layers": [dict(GOOD_LAYER, **layer_patch)]})


def test_missing_layer_field_is_named() -> None:
    layer = dict(GOOD_LAYER)
    del layer["act_bytes"]
    with pytest.raises(ProfileError, match="layer 'l0': field 'act_bytes': missing"):
        ModelProfile.from_dict({"layers": [layer]})


def test_profile_needs_layers_and_a_known_unit() -> None:
    with pytest.raises(ProfileError, match="field 'layers'"):
        ModelProfile.from_dict({"name": "x", "layers": []})
    with pytest.raises(ProfileError, match="unknown unit 'min'"):
        ModelProfile.from_dict({"time_unit": "min", "layers": [GOOD_LAYER]})


@pytest.mark.parametrize("patch,needle", [
    ({"devices": 0}, "field 'devices'"),
    ({"memory_gb": "lots"}, "field 'memory_gb'"),
    ({"p2p_gbps": 0}, "field 'p2p_gbps'"),
    ({"device_list": [{"speed": 1.0}]}, "lists 1 devices but 'devices' is 2"),
    ({"device_list": [{"speed": 0}, {"speed": 1}]}, "field 'speed'"),
    ({"memory_reserve_gb": -1}, "field 'memory_reserve_gb'"),
    ({"memory_reserve_gb": 80}, "leaves nothing of a 80 GiB device"),
    ({"device_list": [{"memory_gb": 80}, {"memory_gb": 3}]}, "leaves nothing of a 3 GiB device"),
    ({"version": 3}, "field 'version': version 3 is newer"),
])
def test_bad_cluster_names_field(patch, needle) -> None:
    raw = {"devices": 2, "memory_gb": 80, "p2p_gbps": 450, "latency_us": 5}
    raw.update(patch)
    with pytest.raises(ClusterError, match=needle):
        Cluster.from_dict(raw)


def test_cluster_missing_required_key(tmp_path) -> None:
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"devices": 2, "memory_gb": 80, "p2p_gbps": 450}))
    with pytest.raises(ClusterError, match="c.json: field 'latency_us': missing"):
        Cluster.load(path)


def test_cluster_round_trip_with_mixed_hardware(tmp_path) -> None:
    raw = {"devices": 2, "memory_gb": 80, "p2p_gbps": 450, "latency_us": 5, "gpus_per_node": 1,
           "inter_node_gbps": 25, "device_list": [{"speed": 1.0, "memory_gb": 80}, {"speed": 0.6, "memory_gb": 40}]}
    cluster = Cluster.from_dict(raw)
    assert cluster.speeds == (1.0, 0.6)
    assert not cluster.same_node(0, 1)
    assert cluster.transfer_seconds(0, 1, 25e9) == pytest.approx(1.0 + 5e-6)
    path = tmp_path / "c.json"
    cluster.save(path)
    assert Cluster.load(path) == cluster
    # a file without memory_reserve_gb gets the default reserve off every device's capacity
    reserve = DEFAULT_MEMORY_RESERVE_GB
    assert cluster.memory_reserve_gb == reserve
    assert cluster.with_memory(10).memory_limits_bytes == ((10 - reserve) * 2**30, (10 - reserve) * 2**30)


def test_action_overhead_is_validated_and_round_trips(tmp_path) -> None:
    from dataclasses import replace

    from tests.conftest import uniform_profile

    prof = replace(uniform_profile(2), action_overhead=0.25)
    prof.save(tmp_path / "p.json")
    assert ModelProfile.load(tmp_path / "p.json").action_overhead == 0.25
    assert prof.scaled(2.0).action_overhead == 0.5
    raw = prof.to_dict() | {"action_overhead": -1}
    with pytest.raises(ProfileError, match="action_overhead"):
        ModelProfile.from_dict(raw)
    with pytest.raises(ProfileError, match="action_overhead"):
        replace(prof, action_overhead=float("nan"))


def test_memory_reserve_comes_off_every_device_and_round_trips(tmp_path) -> None:
    raw = {"version": 2, "devices": 2, "memory_gb": 80, "memory_reserve_gb": 2.5, "p2p_gbps": 450, "latency_us": 5,
           "device_list": [{"memory_gb": 80}, {"memory_gb": 40}]}
    cluster = Cluster.from_dict(raw)
    assert cluster.memory_limits_bytes == (77.5 * 2**30, 37.5 * 2**30)
    path = tmp_path / "c.json"
    cluster.save(path)
    saved = json.loads(path.read_text())
    assert saved["version"] == 2 and saved["memory_reserve_gb"] == 2.5
    assert Cluster.load(path) == cluster
    assert Cluster(devices=1).memory_reserve_gb == 0.0  # built in code: an ideal device unless told


def test_a_binary_file_is_a_clear_error_not_a_decode_traceback(tmp_path) -> None:
    from pipeline.errors import ClusterError, ProfileError
    from pipeline.spec import Cluster, ModelProfile

    blob = tmp_path / "blob.json"
    blob.write_bytes(bytes(range(256)))
    with pytest.raises(ClusterError, match="not a text file"):
        Cluster.load(blob)
    with pytest.raises(ProfileError, match="not a text file"):
        ModelProfile.load(blob)


def test_a_whole_jobs_gpu_count_is_refused_before_anything_is_built() -> None:
    from pipeline.errors import ClusterError
    from pipeline.spec import MAX_CLUSTER_DEVICES, Cluster

    with pytest.raises(ClusterError, match="at most") as info:
        Cluster(devices=10**10)
    assert info.value.field == "devices"
    assert Cluster(devices=MAX_CLUSTER_DEVICES, memory_gb=80).memory_gb == 80

"""A local Ray cluster on loopback for the tests.

Import this module before anything imports ``ray``: Ray picks its node address when
``ray._private.ray_constants`` is first imported. With
``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` it uses the loopback address (as it does on a
laptop), and given ``_node_ip_address="127.0.0.1"`` its GCS, raylet and worker gRPC
servers bind 127.0.0.1 only, instead of every interface. :func:`local_ray` checks that
they did. Usage statistics are off (nothing is sent anywhere).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
os.environ["RAY_USAGE_STATS_ENABLED"] = "0"

import ray  # noqa: E402  (after the environment above)

LOOPBACK = "127.0.0.1"


@contextlib.contextmanager
def local_ray(num_cpus: int = 2) -> Iterator[None]:
    """``ray.init`` a fresh local cluster of ``num_cpus`` CPUs on loopback; ``ray.shutdown`` on exit."""
    assert not ray.is_initialized(), "a Ray cluster is already running in this process"
    ray.init(num_cpus=num_cpus, include_dashboard=False, _node_ip_address=LOOPBACK, log_to_driver=False,
             configure_logging=False)
    try:
        gcs = ray.get_runtime_context().gcs_address
        assert gcs.startswith(f"{LOOPBACK}:"), f"Ray's GCS is at {gcs}, not on loopback (was ray imported earlier?)"
        yield
    finally:
        ray.shutdown()

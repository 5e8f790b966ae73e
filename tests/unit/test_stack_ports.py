"""The dev stack tells which of SeaweedFS's ports another process took, from weed's log."""

from __future__ import annotations

from supervision.dev.stack import taken_port_flag

PORTS = {"master.port": 40001, "filer.port": 40002, "s3.port": 41007}


def test_a_port_refused_by_weeds_start_up_check_names_its_flag() -> None:
    """weed's own check: 'Port allocation failed ... (specified by flag filer.port)'."""
    log = ("F1201 s3.go:1 Port allocation failed: port 40002 for filer"
           " (specified by flag filer.port)")
    assert taken_port_flag(log, PORTS) == "filer.port"


def test_a_port_lost_between_the_check_and_the_bind_names_its_flag() -> None:
    """Taken after weed's check (seen under pytest-xdist: six stacks picking ports at once):
    the listener's 'address already in use' is mapped back to the flag of that port."""
    log = ("F1201 20:01:36.710652 s3.go:434 S3 API Server listener on 127.0.0.1:41007 error:"
           " listen tcp 127.0.0.1:41007: bind: address already in use")
    assert taken_port_flag(log, PORTS) == "s3.port"


def test_any_other_start_up_failure_is_not_a_taken_port() -> None:
    """Another failure, or a port that is not one of ours, is not retried."""
    assert taken_port_flag("F1201 volume.go:9 disk full", PORTS) is None
    assert taken_port_flag("listen tcp 127.0.0.1:9: bind: address already in use",
                           PORTS) is None

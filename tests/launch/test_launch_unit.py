"""zbkit.launch pieces that need no rank processes: argument checks, REPL cells, results."""

import base64
import pickle
import signal
import socket

import cloudpickle
import pytest

from zbkit.launch import Cluster, LaunchError, launch
from zbkit.launch import _channel as ch
from zbkit.launch._errors import exit_status
from zbkit.launch._rich import RichResult, to_payload
from zbkit.launch._worker import run_cell


def add(a, b):
    return a + b


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"nprocs": 0}, ValueError, "nprocs must be a positive int"),
        ({"nprocs": True}, TypeError, r"an int .*e\.g\. nprocs=2\), got True \(bool"),
        ({"nprocs": "2"}, TypeError, r"nprocs must be an int .*got '2' \(str\)"),
        ({"nprocs": 2.0}, TypeError, r"nprocs must be an int .*got 2\.0 \(float\)"),
        ({"nprocs": 2, "backend": "mpi"}, ValueError, "backend must be one of"),
        ({"nprocs": 2, "timeout": -1}, ValueError, "timeout must be a positive number"),
        ({"nprocs": 2, "timeout": float("nan")}, ValueError, "timeout must be a positive number"),
        ({"nprocs": 2, "timeout": "5"}, TypeError,
         r"timeout must be a number of seconds \(e\.g\. timeout=60\) or None, got '5' \(str\)"),
        ({"nprocs": 2, "timeout": True}, TypeError, "timeout must be a number of seconds"),
        ({"nprocs": 2, "master_port": "29500"}, TypeError, "master_port must be an int port"),
        ({"nprocs": 2, "master_port": 70000}, ValueError, r"master_port must be in 1\.\.65535"),
    ],
)  # fmt: skip
def test_bad_arguments_name_the_argument(kwargs, error, match, live_children):
    for start in (lambda: launch(add, 1, 2, **kwargs),
                  lambda: Cluster(**kwargs)):  # fmt: skip
        with pytest.raises(error, match=match) as info:
            start()
        assert "\n" not in str(info.value)  # one line, raised at the edge
    with pytest.raises(error, match=match):  # before the pickling error of a worse mistake
        launch(add, (i for i in range(3)), 1, **kwargs)
    assert live_children() == []


def test_nccl_refused_without_enough_gpus(live_children):
    import torch

    assert torch.cuda.device_count() < 2  # this test is about a machine without 2 GPUs
    for start in (lambda: launch(add, 1, 2, nprocs=2, backend="nccl"),
                  lambda: Cluster(nprocs=2, backend="nccl")):  # fmt: skip
        with pytest.raises(LaunchError, match=r"nprocs=2 needs 2 GPUs.*device_count\(\) is \d"):
            start()
    assert live_children() == []


def test_not_callable_and_unpicklable_arguments_fail_before_any_process(live_children):
    with pytest.raises(TypeError, match="callable"):
        launch(42, nprocs=2)
    with pytest.raises(LaunchError, match="could not pickle"):
        launch(add, (i for i in range(3)), 1, nprocs=2)  # a generator cannot travel
    assert live_children() == []


def test_taken_master_port_is_a_clear_error(live_children):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(LaunchError, match=f"master_port={port} is not free.*master_port=None"):
            launch(add, 1, 2, nprocs=2, master_port=port)
    assert live_children() == []


def test_run_cell_has_repl_semantics():
    ns = {"rank": 3}
    assert run_cell("x = rank * 2\ny = x + 1", "<c1>", ns) is None  # ends in a statement
    assert (ns["x"], ns["y"]) == (6, 7)
    assert run_cell("z = 1\nx + z", "<c2>", ns) == 7  # the final expression's value
    assert run_cell("", "<c3>", ns) is None
    with pytest.raises(SyntaxError):
        run_cell("x = = 1", "<c4>", ns)


def test_channel_round_trip_and_call_payload():
    parent, child = ch.pair()
    payload = ch.call_payload(lambda v: v * 3, (5,), {})
    ch.send(parent, ch.CALL, 7, payload)
    kind, task_id, data = ch.recv(child)
    fn, args, kwargs, source = pickle.loads(data)
    assert (kind, task_id, fn(*args, **kwargs)) == (ch.CALL, 7, 15)
    assert "lambda v: v * 3" in "".join(source[1])  # the source travels for tracebacks
    parent.close()
    with pytest.raises(EOFError):
        ch.recv(child)
    child.close()


def test_results_come_back_as_objects_or_as_their_display():
    assert pickle.loads(to_payload({"a": [1, 2]}, cloudpickle.dumps)) == {"a": [1, 2]}

    class Shown:  # unpicklable (holds a generator), with an HTML view
        gen = None

        def __init__(self):
            self.gen = (i for i in range(2))

        def _repr_html_(self):
            return "<b>shown</b>"

    # a value to compute with must not come back as a picture of itself
    with pytest.raises(TypeError, match=r"the result is a .*Shown, which cannot be pickled"):
        to_payload(Shown(), cloudpickle.dumps)
    with pytest.raises(TypeError, match=r"the result is a generator, which cannot be pickled"):
        to_payload((i for i in range(2)), cloudpickle.dumps)
    back = pickle.loads(to_payload(Shown(), cloudpickle.dumps, display=True))  # only if asked
    assert isinstance(back, RichResult)
    assert back.bundle["text/html"] == "<b>shown</b>"
    assert "could not be pickled" in back.note

    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    fig = Figure()
    fig.add_subplot().plot([0, 1])
    back = pickle.loads(to_payload(fig, cloudpickle.dumps))
    assert base64.b64decode(back._repr_mimebundle_()["image/png"])[:8] == b"\x89PNG\r\n\x1a\n"


def test_exit_status_names_signals():
    assert exit_status(3) == "exit code 3"
    assert exit_status(-signal.SIGKILL).startswith("killed by SIGKILL")
    assert exit_status(-signal.SIGSEGV) == "killed by SIGSEGV"


def test_from_zbkit_import_launch_is_callable_even_after_the_package_is_imported():
    import zbkit
    import zbkit.launch as package
    from zbkit import launch as launch_name

    assert launch_name is package and zbkit.launch is package  # Python's import sets this
    assert package.Cluster is Cluster and zbkit.LaunchError is LaunchError
    with pytest.raises(ValueError, match="nprocs must be a positive int"):
        launch_name(add, 1, 2, nprocs=0)  # calling the package calls launch()


@pytest.fixture
def zb_shell():
    from IPython.core.interactiveshell import InteractiveShell

    from zbkit.launch.magics import ZbMagics

    shell = InteractiveShell.instance()
    shell.register_magics(ZbMagics(shell))
    return shell


@pytest.mark.parametrize(
    "magic, line, match",
    [
        ("zb_start", "-n 0", "%zb_start: nprocs must be a positive int"),
        ("zb_start", "-n 2 --timeout -1", "%zb_start: --timeout must be a positive number"),
        ("zb_start", "-n 2 --timeout nan", "%zb_start: --timeout must be a positive number"),
        ("zb_start", "-n x", "invalid int value"),
        ("zb_start", "", "required: -n"),
        ("zb_start", "-n 2 --backend mpi", "invalid choice"),
        ("zb_stop", "now", "%zb_stop takes no arguments, got 'now'"),
        ("zb_status", "-v", "%zb_status takes no arguments"),
        ("zb", "", "no cluster yet: start one with %zb_start -n 2"),
        ("zb", "--out 1x", "%%zb --out takes a variable name, got '1x'"),
    ],
)
def test_magic_misuse_is_one_usage_line(zb_shell, magic, line, match, live_children):
    from IPython.core.error import UsageError

    run = zb_shell.run_cell_magic if magic == "zb" else zb_shell.run_line_magic
    with pytest.raises(UsageError, match=match) as info:
        run(magic, line, "1") if magic == "zb" else run(magic, line)
    assert "\n" not in str(info.value)  # IPython shows a UsageError as this one line
    assert live_children() == []


def test_a_failure_waiting_on_another_rank_is_listed_after_the_cause():
    from zbkit.launch._collect import Outcome, describe

    out = Outcome(failures={0: "CommTimeout: rank 0: the connection to rank 1 failed",
                            2: "Traceback ...\nValueError: bad", 1: "RuntimeError: also"},
                  waiting={0})  # fmt: skip
    assert list(out.causes_first()) == [2, 1, 0]  # arrival order, echoes last
    msg = describe(out, "launch", "stopped")
    assert msg.startswith("launch failed on ranks 1, 2; then rank 0 failed waiting on another")
    assert msg.index("--- rank 2:") < msg.index("--- rank 1:") < msg.index("--- rank 0:")
    out = Outcome(failures={1: "timed out", 0: "timed out"}, waiting={0, 1})
    assert describe(out, "launch", "stopped").startswith("launch failed on ranks 0, 1.")


def test_many_more_ranks_than_cores_warns_once(monkeypatch, live_children):
    import warnings

    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1}, raising=False)
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    with socket.socket() as busy:  # the start then fails at once: no rank is started
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        for start in (lambda n: launch(add, 1, 2, nprocs=n, master_port=port),
                      lambda n: Cluster(n, master_port=port)):  # fmt: skip
            with pytest.warns(UserWarning) as record, pytest.raises(LaunchError, match="not free"):
                start(9)  # above 4 ranks per core
            assert len(record) == 1 and record[0].filename == __file__  # the caller's line
            assert str(record[0].message).startswith("nprocs=9 ranks on 2 cores: ")
            assert "above 4 ranks per core (here 8) consider fewer ranks" in str(record[0].message)
            with warnings.catch_warnings():
                warnings.simplefilter("error")  # 4 per core is fine: no warning
                with pytest.raises(LaunchError, match="not free"):
                    start(8)
    assert live_children() == []

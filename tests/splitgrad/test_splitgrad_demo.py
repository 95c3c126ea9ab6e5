"""`zbkit demo` runs, prints the groups by name and agrees with autograd."""

import argparse

from zbkit import demo


def test_demo_prints_groups_and_passes(capsys):
    parser = argparse.ArgumentParser()
    demo.add_arguments(parser)
    assert demo.main(parser.parse_args(["--split-only", "--dim", "16", "--tokens", "4"])) == 0
    out = capsys.readouterr().out
    assert "mlp.2.weight, mlp.2.bias" in out and "attn.qkv.weight" in out
    assert "OK" in out and "FAILED" not in out
    # a tolerance nothing can meet makes it fail (the exit code is real)
    assert demo.main(parser.parse_args(["--split-only", "--dim", "16", "--tol", "-1"])) == 1

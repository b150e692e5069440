"""Inductor's compile threads: one unless the caller chose, and never changed after inductor has read them."""

from __future__ import annotations

import sys

from accel_mnist.distributed.compile_threads import VARIABLE, compile_threads, default_compile_threads


def test_one_thread_where_the_caller_set_none(monkeypatch):
    monkeypatch.delitem(sys.modules, "torch._inductor.config", raising=False)
    env: dict[str, str] = {}
    default_compile_threads(env)
    assert env == {VARIABLE: "1"} and compile_threads(env) == "1"


def test_the_callers_choice_is_kept(monkeypatch):
    monkeypatch.delitem(sys.modules, "torch._inductor.config", raising=False)
    env = {VARIABLE: "16"}
    default_compile_threads(env)
    assert env == {VARIABLE: "16"}


def test_nothing_is_set_once_inductor_has_read_its_config(monkeypatch):
    # Inductor reads the variable as its config is imported: setting it later would say what did not happen.
    monkeypatch.setitem(sys.modules, "torch._inductor.config", object())
    env: dict[str, str] = {}
    default_compile_threads(env)
    assert env == {} and compile_threads(env) is None

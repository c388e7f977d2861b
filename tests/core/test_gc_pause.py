"""fxpiece.gc_pause: collection off inside, back to what it was after."""

from __future__ import annotations

import gc

import pytest

from fxpiece import gc_pause


def test_paused_turns_collection_off_and_back_on() -> None:
    assert gc.isenabled()
    with gc_pause.paused():
        assert not gc.isenabled()
        with gc_pause.paused():  # nested: the inner block leaves it off
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()


def test_an_error_inside_still_turns_it_back_on() -> None:
    with pytest.raises(KeyError), gc_pause.paused():
        raise KeyError("x")
    assert gc.isenabled()


def test_a_caller_that_turned_it_off_keeps_it_off() -> None:
    gc.disable()
    try:
        with gc_pause.paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()

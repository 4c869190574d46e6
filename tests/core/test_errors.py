"""The user-facing errors survive a pickle round trip (as through a process pool or multiprocessing queue):
an exception unpickles as `type(*args)`, so one whose __init__ does not take its args cannot come back."""

from __future__ import annotations

import pickle

from edge_runtime.core.errors import InputError, NoRoomToAnswer, QuestionRefused, naming_answer, naming_prompt


def test_no_room_to_answer_pickles() -> None:
    """Seen failing before NoRoomToAnswer.__reduce__: TypeError: NoRoomToAnswer.__init__() missing 2 required
    positional arguments: 'max_tokens' and 'n_ctx'."""
    exc = NoRoomToAnswer(3900, 512, 4096)
    back = pickle.loads(pickle.dumps(exc))
    assert type(back) is NoRoomToAnswer and str(back) == str(exc)
    assert (back.prompt_tokens, back.max_tokens, back.n_ctx, back.field, back.status) == (3900, 512, 4096,
                                                                                         "max_tokens", 400)
    assert back.naming_prompt() == exc.naming_prompt() and back.naming_messages() == exc.naming_messages()


def test_a_question_refused_for_no_room_pickles_with_its_cause() -> None:
    """Seen failing before: the same TypeError, from unpickling the cause."""
    refused = QuestionRefused("max_tokens: no room", "max_tokens", 400, NoRoomToAnswer(3900, 512, 4096))
    back = pickle.loads(pickle.dumps(refused))
    assert type(back) is QuestionRefused and str(back) == str(refused) and back.field == "max_tokens"
    assert isinstance(back.cause, NoRoomToAnswer) and back.cause.n_ctx == 4096
    assert str(naming_prompt(back)) == str(naming_prompt(refused))  # what the routes make of it is the same
    assert str(naming_answer(back, None)) == str(naming_answer(refused, None))
    plain = pickle.loads(pickle.dumps(InputError("x: too long", "x", 413)))
    assert (str(plain), plain.field, plain.status) == ("x: too long", "x", 413)

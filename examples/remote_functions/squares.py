"""Remote functions: each call runs on a worker, its value comes back here.

gpulayer up                                      # once: embedded Redis and a local worker
python3 examples/remote_functions/squares.py
"""

import socket

from stats import summary  # a module of this project: it ships with the code

import gpulayer as gl


@gl.remote
def square(x: int) -> int:
    return x * x


@gl.remote(timeout=60)
def where(tag: str) -> str:
    print(f"running {tag}")  # ends up in the job's log: `gpulayer logs ID`
    return f"{tag} ran on {socket.gethostname()}"


@gl.remote
def check(x: int) -> float:
    if x < 0:
        raise ValueError(f"{x} is negative")
    return x**0.5


if __name__ == "__main__":
    handle = where.remote("the first call")
    print(handle.result())
    print([line.text for line in handle.logs()])

    squares = list(square.map(range(100)))  # one job per item, submitted in batches
    print(gl.remote(summary).remote(squares).result())

    try:
        check.remote(-1).result()
    except ValueError as exc:  # raised here as itself, with the remote traceback in a note
        print("raised remotely:", exc)

"""The quickstart's job: says where it ran and writes greeting.txt, which `submit --wait` brings back."""

import os
import platform
import socket

name = os.environ.get("GREETING_NAME", "world")
where = f"{socket.gethostname()}, Python {platform.python_version()}"
print(f"hello, {name}: job {os.environ['GPULAYER_JOB_ID']} ran on {where}")
with open("greeting.txt", "w") as file:
    file.write(f"hello, {name}\n")
print("wrote greeting.txt")

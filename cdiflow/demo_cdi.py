"""The CDI demo: two processes pass an image through one CDI object, never copying it.

A CDI controller and a minion start as child processes; this process (container ``camera``)
decodes a bundled photo into a CDI object and transfers it to a second process (container
``inverter``), which inverts the pixels in place and transfers the object back.
"""

from __future__ import annotations

import json
import multiprocessing
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import click
import numpy as np
from PIL import Image

import cdi
from cdi.auth import ClusterCredentials
from cdi.controller.client import ControllerClient
from cdi.controller.process import ControllerChild
from cdi.minion.process import MinionChild
from orchestrator.child_process import free_port
from workflows import imagebuf
from workflows.samples import bundled_samples

__all__ = ["run_cdi_demo"]


def _inverter(socket_path: str, key: str, control: Connection) -> None:
    client = cdi.connect(socket_path, "inverter")
    control.send("ready")
    obj = client.use(key)
    view = obj.access(timeout=30)
    received_at = time.perf_counter_ns()
    _, pixels = imagebuf.image_view(view)
    np.subtract(255, pixels, out=pixels)  # in place, in the shared memory
    del pixels
    view.release()
    obj.transfer("camera")
    control.send(received_at)
    client.close()


def run_cdi_demo(data_dir: str = ".data/demo", as_json: bool = False) -> dict[str, Any]:
    folder = Path(data_dir).resolve()
    folder.mkdir(parents=True, exist_ok=True)
    controller_url = f"grpc://127.0.0.1:{free_port()}"
    socket_path = str(folder / "minion.sock")
    source = bundled_samples()["blue_sky.jpg"]
    image = imagebuf.decode_bytes(source.read_bytes())
    report: dict[str, Any] = {"image": str(source), "size": list(image.size)}
    host = "demo"
    credentials = ClusterCredentials.ensure(folder / "credentials", [host])
    controller = ControllerChild(controller_url, str(folder / "controller.log"), credentials)
    with (
        controller,
        MinionChild(
            socket_path, "--host", host, "--controller", controller_url,
            "--controller-token-file", str(credentials.minion_token_file(host)),
            log_path=str(folder / "minion.log"),
        ),
    ):  # fmt: skip
        camera = cdi.connect(socket_path, "camera")
        key = f"frame-{int(time.time())}"
        obj = camera.create(key, imagebuf.required_size(*image.size, image.mode))
        with obj.view() as buffer:
            imagebuf.write_image(buffer, image)
        context = multiprocessing.get_context("spawn")
        mine, theirs = context.Pipe()
        worker = context.Process(target=_inverter, args=(socket_path, key, theirs))
        worker.start()
        assert mine.recv() == "ready"
        time.sleep(0.1)  # let the inverter block in access()
        with controller.client() as directory:
            before = directory.lookup_object(key).owner if _known(directory, key) else "camera"
        started = time.perf_counter_ns()
        obj.transfer("inverter")
        received_at = mine.recv()
        view = obj.access(timeout=30)
        inverted = imagebuf.read_image(view)
        view.release()
        worker.join(timeout=30)
        out = folder / "inverted.png"
        inverted.save(out)
        obj.destroy()
        camera.close()
        report.update(
            object_key=key,
            object_bytes=obj.size,
            owner_before=before,
            handoff_us=round((received_at - started) / 1000, 1),
            result=str(out),
            correct=_is_inverse(image, inverted),
            controller=controller_url,
            minion=socket_path,
        )
    if as_json:
        click.echo(json.dumps(report))
    else:
        click.echo(
            f"camera -> inverter: {report['object_bytes']:,} bytes of pixels handed over in "
            f"{report['handoff_us']} us (ownership moved, no bytes copied)\n"
            f"inverter inverted them in place and handed the object back\n"
            f"result: {out} (pixel-exact inverse: {report['correct']})\n"
            f"logs:   {folder}/controller.log, {folder}/minion.log"
        )
    return report


def _known(directory: ControllerClient, key: str) -> bool:
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        if any(o.key == key for o in directory.list_objects()):
            return True
        time.sleep(0.05)
    return False


def _is_inverse(original: Image.Image, inverted: Image.Image) -> bool:
    a = np.asarray(original, dtype=np.int16)
    b = np.asarray(inverted, dtype=np.int16)
    return bool(a.shape == b.shape and np.all(a + b == 255))

"""A network camera the tests own: an MJPEG stream over real HTTP (``multipart/x-mixed-replace``,
what many IP cameras serve), read by the pipeline's OpenCV/FFmpeg stream source like any
``http://`` camera. `stall()` keeps the connection open but stops sending, the way a hung
camera or a dead link behaves: the reader blocks inside ``read()`` (FFmpeg gives up after
30 s); `quiet` and `sent` say when it stopped and after how many frames. `resume()` sends
frames again."""

from __future__ import annotations

import contextlib
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import cv2

from pipelines.sources.synthetic import SyntheticScene


class MjpegStream:
    """Frames of the synthetic scene at `fps` on ``url``; closed with `close()`."""

    def __init__(self, fps: float = 10.0, size: tuple[int, int] = (320, 240)) -> None:
        self.fps = fps
        self.stalled = threading.Event()
        self.quiet = threading.Event()  # set by the sending thread once it stopped for the stall
        self.sent = 0  # frames written, over every connection
        self._closed = threading.Event()
        scene = SyntheticScene(width=size[0], height=size[1], seed=3)
        stream = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "multipart/x-mixed-replace; boundary=frame")
                self.end_headers()
                index = 0
                with contextlib.suppress(OSError):
                    while not stream._closed.is_set():
                        if stream.stalled.is_set():
                            stream.quiet.set()
                            stream._closed.wait(0.05)
                            continue
                        jpeg = cv2.imencode(".jpg", scene.render(index)[0])[1].tobytes()
                        head = f"--frame\r\nContent-Type: image/jpeg\r\nContent-Length: {len(jpeg)}\r\n\r\n"
                        self.wfile.write(head.encode() + jpeg + b"\r\n")
                        index += 1
                        stream.sent += 1
                        stream._closed.wait(1 / stream.fps)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/camera.mjpg"
        threading.Thread(target=self._server.serve_forever, name="mjpeg-stream", daemon=True).start()

    def stall(self) -> None:
        """Stop sending; `quiet` is set once the sending thread has stopped (`sent` is final)."""
        self.quiet.clear()
        self.stalled.set()

    def resume(self) -> None:
        self.stalled.clear()

    def close(self) -> None:
        self._closed.set()
        self._server.shutdown()
        self._server.server_close()

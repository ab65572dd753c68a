"""A local stand-in for Google Cloud Storage: gcp-storage-emulator serves GCS's JSON API
over HTTP on localhost, and gcsfs (etils.epath), tensorstore (orbax's arrays) and
google-cloud-storage (tensorboardX) are pointed at it through their emulator variables."""
import contextlib
import http.server
import logging
import socket
import sys
import types

import portpicker
import pytest

BUCKET = "t2t-test-bucket"


class _QuietServer(http.server.HTTPServer):
    """Clients that hang up mid-response are not errors worth a traceback."""

    def handle_error(self, request, client_address):
        if not isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):
            super().handle_error(request, client_address)


def _with_generation_headers(download):
    """GCS answers a media download with the object's generation in `x-goog-generation`
    (tensorstore reads it); the emulator leaves it out."""
    def handler(request, response, storage, *args, **kwargs):
        download(request, response, storage, *args, **kwargs)
        try:
            obj = storage.get_file_obj(request.params["bucket_name"], request.params["object_id"])
        except Exception:                               # not found: the 404 stands
            return
        response["x-goog-generation"] = str(obj["generation"])
        response["x-goog-metageneration"] = str(obj["metageneration"])
    return handler


@contextlib.contextmanager
def emulated_gcs():
    """Yields "gs://BUCKET" backed by a fresh in-memory emulator."""
    from gcp_storage_emulator import server as emulator
    port = portpicker.pick_unused_port()
    url = f"http://localhost:{port}"
    patch = pytest.MonkeyPatch()
    for key, value in {"STORAGE_EMULATOR_HOST": url, "TENSORSTORE_GCS_HTTP_URL": url,
                       "GOOGLE_AUTH_TOKEN_FOR_TESTING": "emulator",
                       "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false"}.items():
        patch.setenv(key, value)
    patch.setattr(emulator, "server", types.SimpleNamespace(HTTPServer=_QuietServer))
    original = emulator.objects.download
    download = _with_generation_headers(original)
    patch.setattr(emulator.objects, "download", download)   # objects.get(alt=media) calls it
    for _, handlers in emulator.HANDLERS:                   # the routes that name it
        for method, handler in list(handlers.items()):
            if handler is original:
                patch.setitem(handlers, method, download)
    logging.getLogger("gcp_storage_emulator").setLevel(logging.CRITICAL)
    gcs = emulator.create_server("localhost", port, in_memory=True, default_bucket=BUCKET)
    gcs.start()
    with socket.create_connection(("localhost", port), timeout=5):
        pass
    try:
        yield f"gs://{BUCKET}"
    finally:
        gcs.stop()
        patch.undo()

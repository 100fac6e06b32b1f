"""regis service: the FastAPI app that answers query-by-image over HTTP (``regis serve``).

``service.app.create_app(settings)`` builds the app; the encoder and index load once, in the lifespan.
Importing this package is light (the CLI imports it on every ``regis`` call).
"""


def __getattr__(name: str):
    if name == "create_app":
        from service.app import create_app

        return create_app
    raise AttributeError(f"module 'service' has no attribute {name!r}")


__all__ = ["create_app"]

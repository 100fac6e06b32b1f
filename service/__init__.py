"""regis service: the FastAPI app that answers query-by-image over HTTP (``regis serve``).

``create_app(settings)`` builds the app; the encoder and index load once, in the lifespan.
"""

from service.app import create_app

__all__ = ["create_app"]

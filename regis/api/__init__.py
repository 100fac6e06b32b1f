"""The HTTP API's request and response models (pydantic): the service (``service/``) declares its routes with
them and the Python client (``regis.client``) returns them, so both sides share one definition.

``regis.api.schemas``: search, images, jobs, collections, health, errors; ``regis.api.explain``: explanations.
"""

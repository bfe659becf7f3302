"""The HTTP JSON API: its endpoints (`routes.Api`), problem documents, schemas and the
OpenAPI document. `hongbao.app.create_app` serves it beside the web page."""

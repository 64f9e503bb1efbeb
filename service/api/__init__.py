"""The HTTP layer: schemas, routes, error mapping and middleware over the queues."""

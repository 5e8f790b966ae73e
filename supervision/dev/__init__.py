"""Dev tooling: the embedded stack (PostgreSQL, Tansu, SeaweedFS on loopback) and the
outage proxy of the demo. Imports only the runtime, never actors or the app."""

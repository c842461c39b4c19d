"""OpenEnv environments (`openenv-core`: reset/step servers over HTTP and WebSocket) as schedrl episodes."""

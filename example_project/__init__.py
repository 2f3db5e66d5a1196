"""An example Django project that publishes order events with sqlqueue."""

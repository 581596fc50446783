"""The scheduler: celery beat on RedBeat, fed from SQL, starting scheduled and alarm turns."""

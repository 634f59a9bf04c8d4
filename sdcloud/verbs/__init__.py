"""The user's verbs on a run, below the CLI's commands that call them: resume, stop, logs, the
progress view, the words a run's end is told in, a host that ended itself, handing a run over."""

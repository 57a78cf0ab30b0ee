"""One module per `kairox` subcommand; registered in kairox_py.cli.COMMANDS."""

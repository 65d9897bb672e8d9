from .cli import model_check

model_check(prog_name="python -m taskcustody_model")

from cozystack_gpu.cli.main import console

console()

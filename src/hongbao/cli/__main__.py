from hongbao.cli import main

main()

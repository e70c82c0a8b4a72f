from andrea_exp.runs.frame import main

if __name__ == "__main__":
    main()

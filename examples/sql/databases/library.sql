CREATE TABLE authors (
  id INTEGER PRIMARY KEY,
  name TEXT,
  country TEXT,
  birth_year INTEGER
);
CREATE TABLE books (
  id INTEGER PRIMARY KEY,
  title TEXT,
  author_id INTEGER REFERENCES authors(id),
  genre TEXT,
  year INTEGER,
  pages INTEGER
);
CREATE TABLE members (
  id INTEGER PRIMARY KEY,
  name TEXT,
  city TEXT,
  joined_year INTEGER
);
CREATE TABLE loans (
  id INTEGER PRIMARY KEY,
  book_id INTEGER REFERENCES books(id),
  member_id INTEGER REFERENCES members(id),
  loan_date TEXT,
  returned INTEGER
);
INSERT INTO authors (id, name, country, birth_year) VALUES (1, 'Farid Patel', 'Canada', 1983);
INSERT INTO authors (id, name, country, birth_year) VALUES (2, 'Wei Patel', 'Portugal', 1967);
INSERT INTO authors (id, name, country, birth_year) VALUES (3, 'Umar Larsen', 'Portugal', 1939);
INSERT INTO authors (id, name, country, birth_year) VALUES (4, 'Priya Rossi', 'Portugal', 1935);
INSERT INTO authors (id, name, country, birth_year) VALUES (5, 'Priya Muller', 'Portugal', 1978);
INSERT INTO authors (id, name, country, birth_year) VALUES (6, 'Quinn Kowalski', 'Nigeria', 1990);
INSERT INTO authors (id, name, country, birth_year) VALUES (7, 'Ana Silva', 'Japan', 1971);
INSERT INTO authors (id, name, country, birth_year) VALUES (8, 'Liam Patel', 'France', 1939);
INSERT INTO authors (id, name, country, birth_year) VALUES (9, 'Chloe Garcia', 'Nigeria', 1924);
INSERT INTO authors (id, name, country, birth_year) VALUES (10, 'Zoe Kowalski', 'France', 1950);
INSERT INTO authors (id, name, country, birth_year) VALUES (11, 'Hiro Okafor', 'Portugal', 1945);
INSERT INTO authors (id, name, country, birth_year) VALUES (12, 'Nora Patel', 'Nigeria', 1929);
INSERT INTO authors (id, name, country, birth_year) VALUES (13, 'Tara Smith', 'Portugal', 1980);
INSERT INTO authors (id, name, country, birth_year) VALUES (14, 'Ben Moreau', 'Canada', 1969);
INSERT INTO books (id, title, author_id, genre, year, pages) VALUES (1, 'The Harbor of Orchard', 13, 'mystery', 1989, 341);
INSERT INTO books (id, title, author_id, genre, year, pages) VALUES (2, 'The Letters of Harbor', 2, 'poetry', 1958, 268);
INSERT INTO books (id, title, author_id, genre, year, pages) VALUES (3, 'The Garden of Orchard', 13, 'science', 1997, 253);
INSERT INTO books (id, title, author_id, genre, year, pages) VALUES (4, 'The Night of Signal', 11, 'novel', 2016, 763);
INSERT INTO books (id, title, author_id, genre, year, pages) VALUES (5, 'The Machine of Letters', 4, 'science', 1970, 849);
INSERT INTO books (id, title, author_id, genre, year, pages) VALUES (6, 'The Lantern of Island', 10, 'novel', 1994, 592);
INSERT INTO books (id, title, author_id, genre, year, pages) VALUES (7, 'The Letters of Orchard', 9, 'science', 1981, 341);
INSERT INTO books (id, title, author_id, genre, year, pages) VALUES (8, 'The Mirror of Harbor', 3, 'mystery', 1958, 539);
INSERT INTO books (id, title, author_id, genre, year, pages) VALUES (9, 'The Night of Garden', 13, 'science', 2011, 148);
INSERT INTO books (id, title, author_id, genre, year, pages) VALUES (10, 'The Machine of Empire', 14, 'history', 1956, 354);
INSERT INTO books (id, title, author_id, genre, year, pages) VALUES (11, 'The Lantern of Signal', 11, 'history', 1954, 519);
INSERT INTO books (id, title, author_id, genre, year, pages) VALUES (12, 'The Mirror of Silence', 4, 'poetry', 2000, 161);
INSERT INTO books (id, title, author_id, genre, year, pages) VALUES (13, 'The Winter of Island', 14, 'history', 1968, 244);
INSERT INTO books (id, title, author_id, genre, year, pages) VALUES (14, 'The Island of Silence', 12, 'science', 1956, 348);
INSERT INTO books (id, title, author_id, genre, year, pages) VALUES (15, 'The Empire of Machine', 3, 'mystery', 2011, 118);
INSERT INTO books (id, title, author_id, genre, year, pages) VALUES (16, 'The Forest of Orchard', 4, 'history', 1969, 467);
INSERT INTO books (id, title, author_id, genre, year, pages) VALUES (17, 'The Garden of Silence', 10, 'science', 2012, 685);
INSERT INTO books (id, title, author_id, genre, year, pages) VALUES (18, 'The Silence of Forest', 14, 'science', 1989, 232);
INSERT INTO books (id, title, author_id, genre, year, pages) VALUES (19, 'The Silence of Orchard', 9, 'mystery', 1985, 232);
INSERT INTO books (id, title, author_id, genre, year, pages) VALUES (20, 'The Night of Empire', 13, 'novel', 1998, 791);
INSERT INTO books (id, title, author_id, genre, year, pages) VALUES (21, 'The Empire of Forest', 3, 'novel', 1983, 697);
INSERT INTO books (id, title, author_id, genre, year, pages) VALUES (22, 'The Mirror of Winter', 6, 'poetry', 2003, 353);
INSERT INTO books (id, title, author_id, genre, year, pages) VALUES (23, 'The Forest of Island', 11, 'science', 1967, 226);
INSERT INTO books (id, title, author_id, genre, year, pages) VALUES (24, 'The Orchard of Empire', 3, 'novel', 2000, 186);
INSERT INTO books (id, title, author_id, genre, year, pages) VALUES (25, 'The Orchard of Winter', 3, 'novel', 2007, 895);
INSERT INTO books (id, title, author_id, genre, year, pages) VALUES (26, 'The Night of Machine', 3, 'novel', 1965, 761);
INSERT INTO books (id, title, author_id, genre, year, pages) VALUES (27, 'The Island of Empire', 5, 'poetry', 1988, 641);
INSERT INTO books (id, title, author_id, genre, year, pages) VALUES (28, 'The Orchard of Letters', 6, 'science', 2013, 314);
INSERT INTO books (id, title, author_id, genre, year, pages) VALUES (29, 'The River of Forest', 10, 'poetry', 1973, 278);
INSERT INTO books (id, title, author_id, genre, year, pages) VALUES (30, 'The Winter of Harbor', 14, 'science', 1975, 817);
INSERT INTO books (id, title, author_id, genre, year, pages) VALUES (31, 'The Orchard of Garden', 12, 'mystery', 1955, 708);
INSERT INTO books (id, title, author_id, genre, year, pages) VALUES (32, 'The River of Lantern', 12, 'mystery', 1957, 899);
INSERT INTO books (id, title, author_id, genre, year, pages) VALUES (33, 'The Garden of Empire', 1, 'science', 2009, 155);
INSERT INTO books (id, title, author_id, genre, year, pages) VALUES (34, 'The Harbor of Lantern', 7, 'mystery', 1972, 818);
INSERT INTO books (id, title, author_id, genre, year, pages) VALUES (35, 'The Signal of Harbor', 4, 'history', 1990, 853);
INSERT INTO books (id, title, author_id, genre, year, pages) VALUES (36, 'The Harbor of Forest', 1, 'poetry', 1999, 249);
INSERT INTO books (id, title, author_id, genre, year, pages) VALUES (37, 'The River of Letters', 5, 'history', 2014, 652);
INSERT INTO books (id, title, author_id, genre, year, pages) VALUES (38, 'The Letters of Lantern', 8, 'mystery', 1962, 648);
INSERT INTO books (id, title, author_id, genre, year, pages) VALUES (39, 'The Letters of Forest', 10, 'novel', 2015, 699);
INSERT INTO books (id, title, author_id, genre, year, pages) VALUES (40, 'The Letters of Island', 12, 'history', 2016, 407);
INSERT INTO members (id, name, city, joined_year) VALUES (1, 'Jonas Rossi', 'Lisbon', 2017);
INSERT INTO members (id, name, city, joined_year) VALUES (2, 'Chloe Moreau', 'Lyon', 2017);
INSERT INTO members (id, name, city, joined_year) VALUES (3, 'Grace Ivanova', 'Osaka', 2021);
INSERT INTO members (id, name, city, joined_year) VALUES (4, 'Vera Patel', 'Porto', 2022);
INSERT INTO members (id, name, city, joined_year) VALUES (5, 'David Novak', 'Austin', 2020);
INSERT INTO members (id, name, city, joined_year) VALUES (6, 'Umar Novak', 'Krakow', 2013);
INSERT INTO members (id, name, city, joined_year) VALUES (7, 'Umar Smith', 'Austin', 2024);
INSERT INTO members (id, name, city, joined_year) VALUES (8, 'Quinn Silva', 'Austin', 2016);
INSERT INTO members (id, name, city, joined_year) VALUES (9, 'Vera Smith', 'Krakow', 2019);
INSERT INTO members (id, name, city, joined_year) VALUES (10, 'Priya Chen', 'Dublin', 2023);
INSERT INTO members (id, name, city, joined_year) VALUES (11, 'Maya Novak', 'Lisbon', 2012);
INSERT INTO members (id, name, city, joined_year) VALUES (12, 'Hiro Silva', 'Osaka', 2013);
INSERT INTO members (id, name, city, joined_year) VALUES (13, 'Ben Patel', 'Krakow', 2024);
INSERT INTO members (id, name, city, joined_year) VALUES (14, 'Ben Kowalski', 'Dublin', 2021);
INSERT INTO members (id, name, city, joined_year) VALUES (15, 'Ines Chen', 'Lyon', 2011);
INSERT INTO members (id, name, city, joined_year) VALUES (16, 'Yara Patel', 'Lyon', 2011);
INSERT INTO members (id, name, city, joined_year) VALUES (17, 'Omar Kowalski', 'Krakow', 2019);
INSERT INTO members (id, name, city, joined_year) VALUES (18, 'Maya Chen', 'Dublin', 2021);
INSERT INTO members (id, name, city, joined_year) VALUES (19, 'Kira Dubois', 'Austin', 2011);
INSERT INTO members (id, name, city, joined_year) VALUES (20, 'Hiro Novak', 'Lyon', 2021);
INSERT INTO loans (id, book_id, member_id, loan_date, returned) VALUES (1, 28, 7, '2024-06-12', 0);
INSERT INTO loans (id, book_id, member_id, loan_date, returned) VALUES (2, 17, 3, '2022-06-17', 1);
INSERT INTO loans (id, book_id, member_id, loan_date, returned) VALUES (3, 10, 17, '2022-04-20', 1);
INSERT INTO loans (id, book_id, member_id, loan_date, returned) VALUES (4, 25, 6, '2023-08-13', 1);
INSERT INTO loans (id, book_id, member_id, loan_date, returned) VALUES (5, 30, 20, '2024-05-22', 0);
INSERT INTO loans (id, book_id, member_id, loan_date, returned) VALUES (6, 25, 20, '2023-02-07', 0);
INSERT INTO loans (id, book_id, member_id, loan_date, returned) VALUES (7, 3, 12, '2024-12-12', 0);
INSERT INTO loans (id, book_id, member_id, loan_date, returned) VALUES (8, 5, 17, '2024-01-13', 1);
INSERT INTO loans (id, book_id, member_id, loan_date, returned) VALUES (9, 29, 8, '2022-09-05', 0);
INSERT INTO loans (id, book_id, member_id, loan_date, returned) VALUES (10, 20, 7, '2023-06-01', 1);
INSERT INTO loans (id, book_id, member_id, loan_date, returned) VALUES (11, 11, 5, '2024-07-17', 0);
INSERT INTO loans (id, book_id, member_id, loan_date, returned) VALUES (12, 20, 7, '2023-07-18', 0);
INSERT INTO loans (id, book_id, member_id, loan_date, returned) VALUES (13, 15, 19, '2024-08-26', 0);
INSERT INTO loans (id, book_id, member_id, loan_date, returned) VALUES (14, 38, 3, '2022-07-27', 0);
INSERT INTO loans (id, book_id, member_id, loan_date, returned) VALUES (15, 10, 2, '2023-09-20', 1);
INSERT INTO loans (id, book_id, member_id, loan_date, returned) VALUES (16, 31, 11, '2022-05-05', 1);
INSERT INTO loans (id, book_id, member_id, loan_date, returned) VALUES (17, 19, 10, '2024-11-01', 0);
INSERT INTO loans (id, book_id, member_id, loan_date, returned) VALUES (18, 5, 6, '2024-02-22', 0);
INSERT INTO loans (id, book_id, member_id, loan_date, returned) VALUES (19, 24, 9, '2023-01-06', 0);
INSERT INTO loans (id, book_id, member_id, loan_date, returned) VALUES (20, 38, 16, '2023-11-26', 1);
INSERT INTO loans (id, book_id, member_id, loan_date, returned) VALUES (21, 11, 2, '2022-04-12', 1);
INSERT INTO loans (id, book_id, member_id, loan_date, returned) VALUES (22, 27, 7, '2024-04-24', 1);
INSERT INTO loans (id, book_id, member_id, loan_date, returned) VALUES (23, 6, 11, '2022-04-17', 0);
INSERT INTO loans (id, book_id, member_id, loan_date, returned) VALUES (24, 23, 20, '2024-11-21', 0);
INSERT INTO loans (id, book_id, member_id, loan_date, returned) VALUES (25, 2, 12, '2023-08-06', 1);
INSERT INTO loans (id, book_id, member_id, loan_date, returned) VALUES (26, 2, 9, '2024-01-07', 0);
INSERT INTO loans (id, book_id, member_id, loan_date, returned) VALUES (27, 20, 13, '2022-08-23', 1);
INSERT INTO loans (id, book_id, member_id, loan_date, returned) VALUES (28, 1, 12, '2022-10-09', 0);
INSERT INTO loans (id, book_id, member_id, loan_date, returned) VALUES (29, 25, 6, '2022-09-17', 1);
INSERT INTO loans (id, book_id, member_id, loan_date, returned) VALUES (30, 14, 8, '2024-09-10', 1);
INSERT INTO loans (id, book_id, member_id, loan_date, returned) VALUES (31, 24, 3, '2022-07-20', 0);
INSERT INTO loans (id, book_id, member_id, loan_date, returned) VALUES (32, 23, 18, '2024-06-19', 0);
INSERT INTO loans (id, book_id, member_id, loan_date, returned) VALUES (33, 2, 14, '2024-01-22', 0);
INSERT INTO loans (id, book_id, member_id, loan_date, returned) VALUES (34, 7, 7, '2024-09-12', 1);
INSERT INTO loans (id, book_id, member_id, loan_date, returned) VALUES (35, 8, 6, '2022-11-14', 1);
INSERT INTO loans (id, book_id, member_id, loan_date, returned) VALUES (36, 32, 7, '2024-04-09', 0);
INSERT INTO loans (id, book_id, member_id, loan_date, returned) VALUES (37, 28, 13, '2022-08-16', 1);
INSERT INTO loans (id, book_id, member_id, loan_date, returned) VALUES (38, 3, 18, '2023-04-02', 1);
INSERT INTO loans (id, book_id, member_id, loan_date, returned) VALUES (39, 38, 15, '2023-12-05', 0);
INSERT INTO loans (id, book_id, member_id, loan_date, returned) VALUES (40, 11, 13, '2022-07-02', 0);
INSERT INTO loans (id, book_id, member_id, loan_date, returned) VALUES (41, 38, 10, '2024-08-07', 1);
INSERT INTO loans (id, book_id, member_id, loan_date, returned) VALUES (42, 15, 18, '2023-11-02', 0);
INSERT INTO loans (id, book_id, member_id, loan_date, returned) VALUES (43, 24, 5, '2023-06-15', 1);
INSERT INTO loans (id, book_id, member_id, loan_date, returned) VALUES (44, 25, 19, '2024-08-20', 0);
INSERT INTO loans (id, book_id, member_id, loan_date, returned) VALUES (45, 17, 4, '2023-11-09', 1);
INSERT INTO loans (id, book_id, member_id, loan_date, returned) VALUES (46, 8, 7, '2024-06-28', 0);
INSERT INTO loans (id, book_id, member_id, loan_date, returned) VALUES (47, 20, 8, '2024-03-05', 1);
INSERT INTO loans (id, book_id, member_id, loan_date, returned) VALUES (48, 7, 20, '2023-11-07', 0);
INSERT INTO loans (id, book_id, member_id, loan_date, returned) VALUES (49, 9, 16, '2024-08-07', 0);
INSERT INTO loans (id, book_id, member_id, loan_date, returned) VALUES (50, 22, 17, '2023-01-07', 0);
INSERT INTO loans (id, book_id, member_id, loan_date, returned) VALUES (51, 19, 2, '2023-12-27', 1);
INSERT INTO loans (id, book_id, member_id, loan_date, returned) VALUES (52, 4, 4, '2024-11-17', 0);
INSERT INTO loans (id, book_id, member_id, loan_date, returned) VALUES (53, 15, 20, '2024-08-16', 1);
INSERT INTO loans (id, book_id, member_id, loan_date, returned) VALUES (54, 28, 1, '2024-06-05', 1);
INSERT INTO loans (id, book_id, member_id, loan_date, returned) VALUES (55, 26, 15, '2024-11-15', 0);
INSERT INTO loans (id, book_id, member_id, loan_date, returned) VALUES (56, 29, 8, '2022-11-15', 0);
INSERT INTO loans (id, book_id, member_id, loan_date, returned) VALUES (57, 38, 19, '2024-02-12', 1);
INSERT INTO loans (id, book_id, member_id, loan_date, returned) VALUES (58, 10, 6, '2022-05-11', 1);
INSERT INTO loans (id, book_id, member_id, loan_date, returned) VALUES (59, 20, 7, '2022-08-06', 0);
INSERT INTO loans (id, book_id, member_id, loan_date, returned) VALUES (60, 10, 1, '2024-03-28', 0);
